"""One evaluation as an Argo Workflow, of the iteration's templates: serve, plan, rollout fan-out, trajectories,
then evaluate.

    from workflows.config import load_config
    from workflows.evaluation import evaluation_workflow
    print(evaluation_workflow(load_config("configs/cluster-example.yaml", ["run=demo"]), 0).to_yaml())

It evaluates the checkpoint iteration `iteration` of the run serves: an eval run's one evaluation (0: the
config's `model`, which `submit.py eval --checkpoint RUN:ITERATION` set to that run's checkpoint), or a
training run's final checkpoint (`iterations`), which no iteration serves. The outer DAG `evaluation` runs
`collect` (the iteration's: network policies, the serve daemon, `plan --eval` -> `rollout` x (tasks x k) ->
`trajectories`, into the evaluation's folder) and then `evaluate` (summary.json), whether or not every rollout
succeeded, so that infra errors are counted. The exit handler (the iteration's `exit`: `record`, then
`report`) writes the evaluation's record (`manifest/eval-<N>.json`) and then the run's report. The templates
are `workflows.iteration`'s, given the evaluation's folders; the rollout template keeps its name, so the
driver's progress and `retry` work as for iterations.
"""

from hera.workflows import Container, Workflow

from steps.contracts.config import RunConfig
from workflows import commands, shape
from workflows.iteration import (collect_dag, dag, evaluation_templates, exit_dag, fetch_model_template, image,
                                 report_template, run_label, run_workflow, s3_env, serve_templates, step_pod)


def workflow_name(config: RunConfig, iteration: int) -> str:
    """The evaluation's Workflow name: fixed, so that a resumed driver finds it (DNS-1123)."""
    return f"openforge-{run_label(config)}-eval{iteration}"


def record_template(config: RunConfig, iteration: int) -> Container:
    """The exit handler's first step: the evaluation's final phase and overall numbers into the run manifest."""
    return Container(
        name="record", image=image(config, "steps"), env=s3_env(config), **step_pod(config, "100m"),
        command=commands.record_eval(config, iteration, "{{workflow.name}}", "{{workflow.status}}"),
    )


def evaluation_workflow(config: RunConfig, iteration: int) -> Workflow:
    """The evaluation of iteration `iteration`'s checkpoint as one Workflow."""
    templates = [dag("evaluation", shape.evaluation(config, iteration)), collect_dag(config),
                 *serve_templates(config, iteration), *evaluation_templates(config, iteration, ""), exit_dag(),
                 record_template(config, iteration), report_template(config),
                 *([fetch_model_template(config)] if shape.fetches_model(config, iteration) else [])]
    return run_workflow(config, workflow_name(config, iteration), templates,
                        {"openforge.dev/evaluation": str(iteration)})
