"""A strict JSON Schema of the JobSet fields `workflows/jobset.py` writes, and of the status its conditions read.

Written by hand from JobSet v0.12.0's API types (`api/jobset/v1alpha2/jobset_types.go`: JobSetSpec,
ReplicatedJob, Network, FailurePolicy, JobSetStatus) and the Kubernetes types they embed (batch/v1 JobSpec,
core/v1 PodSpec, Container, EnvVar, Volume), with the values Kubernetes' validation accepts for the enums.
Only what OpenForge uses, plus the neighbours a misspelling would most likely hit, is listed, and every object
forbids unknown keys: a field JobSet or Kubernetes does not have (or one OpenForge does not mean to set) fails
the check here, before a cluster would refuse it. (Argo's executor runs kubectl, whose default field validation is
strict: the API server refuses an unknown field of JobSet's structural CRD, and the step fails.)

Why not JobSet's own CRD (`config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml`): it embeds the whole
Job and Pod specs, thousands of lines to commit and keep in step with each release, and it leaves out what
JobSet's webhook checks (the pods' name length). A hand-written schema agrees with its author by construction, so
its fields were checked one by one against v0.12.0's Go types; the preflight's server-side dry run checks the
real manifest against the real CRD and webhook on a cluster.
"""

QUANTITY = {"anyOf": [{"type": "integer"}, {"type": "string", "pattern": r"^[0-9]+(\.[0-9]+)?([KMGTPE]i?|m)?$"}]}
STRING, BOOL, INT32 = {"type": "string"}, {"type": "boolean"}, {"type": "integer", "minimum": 0, "maximum": 2**31 - 1}
LABELS = {"type": "object", "additionalProperties": STRING}


def obj(required: tuple[str, ...] = (), **properties: dict) -> dict:
    """An object schema with exactly these properties (no other key allowed)."""
    return {"type": "object", "properties": properties, "required": list(required), "additionalProperties": False}


def array(items: dict) -> dict:
    """An array schema."""
    return {"type": "array", "items": items}


ENV_VAR = obj(("name",), name=STRING, value=STRING, valueFrom=obj(
    secretKeyRef=obj(("key",), name=STRING, key=STRING, optional=BOOL),
    fieldRef=obj(("fieldPath",), apiVersion=STRING, fieldPath=STRING)))
CONTAINER = obj(
    ("name",), name=STRING, image=STRING, workingDir=STRING, command=array(STRING), args=array(STRING),
    env=array(ENV_VAR),
    resources=obj(limits={"type": "object", "additionalProperties": QUANTITY},
                  requests={"type": "object", "additionalProperties": QUANTITY}),
    ports=array(obj(("containerPort",), name=STRING, containerPort={"type": "integer", "minimum": 1, "maximum": 65535},
                    protocol={"enum": ["TCP", "UDP", "SCTP"]})),
    volumeMounts=array(obj(("name", "mountPath"), name=STRING, mountPath=STRING, readOnly=BOOL)))
# core/v1 Toleration and the required node affinity `workflows.pods` writes (NodeSelectorTerm's matchExpressions).
TOLERATION = obj(key=STRING, operator={"enum": ["Exists", "Equal"]}, value=STRING, tolerationSeconds={"type": "integer"},
                 effect={"enum": ["NoSchedule", "PreferNoSchedule", "NoExecute"]})
NODE_REQUIREMENT = obj(("key", "operator"), key=STRING, values=array(STRING),
                       operator={"enum": ["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]})
AFFINITY = obj(nodeAffinity=obj(requiredDuringSchedulingIgnoredDuringExecution=obj(
    ("nodeSelectorTerms",), nodeSelectorTerms=array(obj(matchExpressions=array(NODE_REQUIREMENT),
                                                        matchFields=array(NODE_REQUIREMENT))))))
POD_SPEC = obj(
    ("containers",), containers=array(CONTAINER), restartPolicy={"enum": ["Always", "OnFailure", "Never"]},
    automountServiceAccountToken=BOOL, serviceAccountName=STRING, nodeSelector=LABELS,
    tolerations=array(TOLERATION), affinity=AFFINITY, priorityClassName=STRING, hostNetwork=BOOL,
    dnsPolicy={"enum": ["ClusterFirstWithHostNet", "ClusterFirst", "Default", "None"]},  # core/v1 DNSPolicy
    volumes=array(obj(("name",), name=STRING, emptyDir=obj(medium={"enum": ["", "Memory"]}, sizeLimit=QUANTITY))))
JOB_SPEC = obj(
    ("template",), parallelism=INT32, completions=INT32, completionMode={"enum": ["NonIndexed", "Indexed"]},
    backoffLimit=INT32, activeDeadlineSeconds=INT32,
    template=obj(("spec",), metadata=obj(labels=LABELS, annotations=LABELS), spec=POD_SPEC))
JOBSET_SPEC = obj(
    ("replicatedJobs",),
    replicatedJobs=array(obj(("name", "template"), name=STRING, groupName=STRING, replicas=INT32,
                             template=obj(("spec",), metadata=obj(labels=LABELS, annotations=LABELS), spec=JOB_SPEC))),
    network=obj(enableDNSHostnames=BOOL, subdomain=STRING, publishNotReadyAddresses=BOOL),
    successPolicy=obj(("operator",), operator={"enum": ["All", "Any"]}, targetReplicatedJobs=array(STRING)),
    failurePolicy=obj(maxRestarts=INT32, restartStrategy={"enum": ["Recreate", "BlockingRecreate", "InPlaceRestart"]}),
    suspend=BOOL, ttlSecondsAfterFinished=INT32)
JOBSET_STATUS = obj(
    conditions=array({"type": "object"}), restarts=INT32, restartsCountTowardsMax=INT32,
    terminalState={"enum": ["Completed", "Failed"]}, replicatedJobsStatus=array({"type": "object"}))
JOBSET = obj(
    ("apiVersion", "kind", "metadata", "spec"), apiVersion={"const": "jobset.x-k8s.io/v1alpha2"},
    kind={"const": "JobSet"}, metadata=obj(name=STRING, generateName=STRING, namespace=STRING, labels=LABELS,
                                           annotations=LABELS),
    spec=JOBSET_SPEC, status=JOBSET_STATUS)
