"""Where an agent and its verifier run: a task's environment, isolated.

`local` is the layered bubblewrap sandbox a runner without containers uses (`local.py`'s docstring says
what it isolates); `pod` is a Kubernetes rollout pod seen as the same `Sandbox`; `build` applies a task's
Dockerfile to a local layer (`dockerfile` reads it); `root`, `network` and `limits` are the local sandbox's
overlay root, its tunnel to the proxy, and its cgroups and disk; `common` is what they all share.
"""

from steps.sandbox.common import RunResult, SandboxError, VerifierRefused
from steps.sandbox.local import Bind, Sandbox

__all__ = ["Bind", "RunResult", "Sandbox", "SandboxError", "VerifierRefused"]
