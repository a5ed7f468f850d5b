"""Writing and reading trajectory tables as Parquet (zstd) on any fsspec URL: a local folder or `s3://`.

Layout, partitioned by run and iteration (Hive-style names, so `pyarrow.dataset` can also read it;
`steps.contracts.layout.partition_url` and `table_url` own it):

    {out}/run={run}/iteration={iteration}/{calls,rollouts,samples}.parquet

A file is written whole or not at all: locally to a temporary name in the same folder, then renamed
into place; on an object store the finished file goes up as one PUT, which readers never see half-done.
Every read checks the file (Parquet footer, page checksums) and the schema, and names the file on failure.
"""

import os
import uuid

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from steps.contracts.layout import partition_url, table_url  # noqa: F401 - partition_url is this module's API too
from steps.contracts.tables import TABLES, check_schema

COMPRESSION = "zstd"
COMPRESSION_LEVEL = 3  # level 9 saved little and cost 2-3x on token ids (notes/argo-hera-s3.md)


class TrajectoryFileError(ValueError):
    """A trajectory file that is missing, truncated or not Parquet."""


def _filesystem(url: str, storage_options: dict | None) -> tuple[fsspec.AbstractFileSystem, str, bool]:
    fs, path = fsspec.core.url_to_fs(url, **(storage_options or {}))
    protocols = (fs.protocol,) if isinstance(fs.protocol, str) else tuple(fs.protocol)
    return fs, path, "file" in protocols or "local" in protocols


def write_table(table: pa.Table, partition: str, name: str, storage_options: dict | None = None) -> str:
    """Writes `table` as `{partition}/{name}.parquet` atomically; returns the file's URL.

    The table must have the documented schema of `name` (checked before anything is written).
    """
    table = check_schema(table, TABLES[name], f"the {name} table being written")
    url = table_url(partition, name)
    fs, path, local = _filesystem(url, storage_options)
    options = {"compression": COMPRESSION, "compression_level": COMPRESSION_LEVEL, "write_page_checksum": True}
    if local:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        # A leading dot: a crash's leftover is skipped by `pyarrow.dataset` discovery as well as by read_table.
        folder, base = os.path.split(path)
        tmp = os.path.join(folder, f".{base}.{uuid.uuid4().hex}.tmp")
        try:
            pq.write_table(table, tmp, **options)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
        return url
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, **options)
    fs.pipe_file(path, sink.getvalue().to_pybytes())
    return url


def read_table(partition: str, name: str, storage_options: dict | None = None) -> pa.Table:
    """Reads `{partition}/{name}.parquet`, checked against the documented schema of `name`.

    Raises TrajectoryFileError for a missing, truncated or corrupt file and SchemaError for wrong
    columns, each naming the file.
    """
    url = table_url(partition, name)
    fs, path, local = _filesystem(url, storage_options)
    try:
        source = path if local else pa.BufferReader(fs.cat_file(path))
        table = pq.read_table(source, page_checksum_verification=True)
    except FileNotFoundError:
        raise TrajectoryFileError(f"{url} does not exist.") from None
    except (pa.ArrowInvalid, OSError) as err:
        raise TrajectoryFileError(f"{url} is not a complete Parquet file (truncated or corrupt): {err}") from None
    return check_schema(table, TABLES[name], url)


def write_tables(tables: dict[str, pa.Table], partition: str, storage_options: dict | None = None) -> dict[str, str]:
    """Writes each named table into the partition; `rollouts` last, so its presence marks a complete write."""
    order = sorted(tables, key=lambda name: name == "rollouts")
    return {name: write_table(tables[name], partition, name, storage_options) for name in order}
