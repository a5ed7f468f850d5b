"""The floor under the steps: what crosses a step boundary, typed, with its stored forms.

- `layout`: every URL under a run's folder in the store;
- `config`: the run's config type (`RunConfig`), which every step reads a stored run's config into;
- `limits`: the defaults of what one rollout may leave on the host;
- `tables`: the trajectory tables' schemas, the `samples` row (`SampleRow`) the update reads them into;
- `table_files`: those tables as Parquet files, written whole and read back checked;
- `calls`: the proxy's record of one model call (`CallRecord`) and its stored JSON form;
- `manifest`: the run manifest's records of each iteration and evaluation (`IterationRecord`, `EvalRecord`);
- `rollout`: a rollout's two records, the planned rollout (the plan step's item) and its result (`result.json`),
  with their JSON forms and readers.

Nothing here imports from `steps` or `workflows` beyond this package (tests/test_imports.py): every step and
both runners stand on it, and it stands on the standard library alone, but for pyarrow (`tables`) and fsspec
(`table_files`), which the update's environment has too.
"""
