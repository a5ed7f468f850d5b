"""Images in the call store: written once by the SHA-256 of their bytes, create-only, before the record that
names them; records keep references in prompt order; readers check every image a call names.

The proxy is the real subprocess, in a local folder and in S3 (moto on loopback); its upstream records what
it is sent (`tests/screenshots.py`: a double, since a model is not the point here), so each test also shows
that vLLM still gets every image's bytes.
"""

import asyncio
import base64
import json
import os
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import boto3
import httpx
import orjson
import pytest

from proxy_process import start_proxy, stop_proxy
from screenshots import CapturingUpstream, data_url, screenshot, sha
from steps.proxy.image_store import ImageStore, ImageUnreadable
from steps.proxy.images import REFERENCE_PREFIX, from_base64
from steps.proxy.store import CallStore

ADMIN = "test-admin-key"


@pytest.fixture(scope="module")
def upstream():
    with CapturingUpstream() as server:
        yield server


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path) -> dict:
    """A store URL, the env its proxy needs, and a way to read and write its objects by relative name."""
    if request.param == "local":
        root = tmp_path / "store"
        return {"url": str(root), "env": {}, "read": lambda name: _read_local(root / name),
                "names": lambda folder: sorted(p.name for p in (root / folder).iterdir()) if (root / folder).exists() else [],
                "write": lambda name, data: (root / name).write_bytes(data), "delete": lambda name: (root / name).unlink()}
    s3 = request.getfixturevalue("s3_server")
    prefix = f"images-{uuid.uuid4().hex[:8]}"
    client = boto3.client("s3", endpoint_url=s3["endpoint_url"], region_name="us-east-1",
                          aws_access_key_id="testing", aws_secret_access_key="testing")

    def read(name):
        try:
            return client.get_object(Bucket=s3["bucket"], Key=f"{prefix}/{name}")["Body"].read()
        except client.exceptions.NoSuchKey:
            return None

    def names(folder):
        listed = client.list_objects_v2(Bucket=s3["bucket"], Prefix=f"{prefix}/{folder}/").get("Contents", [])
        return sorted(item["Key"].rsplit("/", 1)[-1] for item in listed)

    return {"url": f"s3://{s3['bucket']}/{prefix}", "env": s3["env"], "read": read, "names": names,
            "write": lambda name, data: client.put_object(Bucket=s3["bucket"], Key=f"{prefix}/{name}", Body=data),
            "delete": lambda name: client.delete_object(Bucket=s3["bucket"], Key=f"{prefix}/{name}")}


def _read_local(path: Path) -> bytes | None:
    return path.read_bytes() if path.exists() else None


def post(url: str, key: str, body: dict) -> tuple[int, dict | bytes]:
    answer = httpx.post(url, content=json.dumps(body).encode(), timeout=120,
                        headers={"authorization": f"Bearer {key}", "x-api-key": key, "content-type": "application/json"})
    is_json = answer.headers.get("content-type", "").startswith("application/json")
    return answer.status_code, answer.json() if is_json else answer.content


def user(text: str, *pngs: bytes) -> dict:
    return {"role": "user", "content": [{"type": "text", "text": text},
                                        *[{"type": "image_url", "image_url": {"url": data_url(p)}} for p in pngs]]}


def chat(messages: list[dict], stream: bool = False) -> dict:
    return {"messages": messages, "model": "tiny", "max_tokens": 8, "stream": stream}


def stored_records(store: dict, rollout_id: str) -> list[bytes]:
    """The rollout's records exactly as stored (a local log's lines, or one object each)."""
    log = store["read"](f"rollouts/{rollout_id}/calls.jsonl")
    if log is not None:
        return log.splitlines()
    return [store["read"](f"rollouts/{rollout_id}/calls/{name}") for name in store["names"](f"rollouts/{rollout_id}/calls")]


def local_log(root: Path, rollout_id: str) -> list[bytes]:
    """A rollout's records in a local store, as stored."""
    return (_read_local(root / "rollouts" / rollout_id / "calls.jsonl") or b"").splitlines()


def test_a_screenshot_sent_with_every_call_is_stored_once_and_records_name_their_images_in_prompt_order(upstream, store, tmp_path):
    first, second = screenshot(1), screenshot(2)  # one size, different content
    proxy = start_proxy(upstream.url, store["url"], ADMIN, env=store["env"], log_path=tmp_path / "proxy.log")
    try:
        rollout = proxy.register("r")
        url, key = f"{rollout['openai_base_url']}/chat/completions", rollout["api_key"]
        history = [user("open the page and fill in the form. " * 50, first)]
        assert post(url, key, chat(history))[0] == 200
        history += [{"role": "assistant", "content": "clicked"}, user("now", second)]
        assert post(url, key, chat(history, stream=True))[0] == 200
        anthropic = {"model": "tiny", "max_tokens": 8, "messages": [{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": base64.b64encode(second).decode()}},
            {"type": "text", "text": "again"}]}]}
        assert post(f"{rollout['anthropic_base_url']}/v1/messages", key, anthropic)[0] == 200
        calls = proxy.calls("r")
    finally:
        stop_proxy(proxy)
    # vLLM got every image's bytes; the store holds each once, as sent.
    sent = [[p["image_url"]["url"] for m in body["messages"] if isinstance(m["content"], list) for p in m["content"]
             if p["type"] == "image_url"] for body in upstream.bodies[-3:]]
    assert sent == [[data_url(first)], [data_url(first), data_url(second)], [data_url(second)]]
    assert store["names"]("images") == sorted([sha(first), sha(second)])
    assert store["read"](f"images/{sha(first)}") == first and store["read"](f"images/{sha(second)}") == second
    # Records name them in prompt order; stored bytes hold no image, only names.
    assert [[ref["sha256"] for ref in call["images"]] for call in calls] == [[sha(first)], [sha(first), sha(second)], [sha(second)]]
    assert calls[0]["images"][0] == {"sha256": sha(first), "media_type": "image/png", "width": 1280, "height": 720}
    records = stored_records(store, "r")
    payloads = [base64.b64encode(png)[:2000] for png in (first, second)]
    assert len(records) == 3 and not any(payload in line for payload in payloads for line in records)
    assert calls[1]["request"]["messages"][2]["content"][1]["image_url"]["url"] == REFERENCE_PREFIX + sha(second)
    assert calls[2]["request"]["messages"][0]["content"][0]["source"]["data"] == REFERENCE_PREFIX + sha(second)
    assert orjson.loads(records[1])["request_shared"] is not None  # the request still shares with the call before
    assert all("store_error" not in call for call in calls)


def test_a_missing_or_altered_image_is_a_store_error_of_the_calls_that_name_it_never_a_crash(upstream, store, tmp_path,
                                                                                            monkeypatch):
    pngs = [screenshot(10), screenshot(11), screenshot(12)]
    proxy = start_proxy(upstream.url, store["url"], ADMIN, env=store["env"], log_path=tmp_path / "proxy.log")
    try:
        rollout = proxy.register("bad")
        url, key = f"{rollout['openai_base_url']}/chat/completions", rollout["api_key"]
        for n, png in enumerate(pngs):
            assert post(url, key, chat([user(f"step {n}", png)]))[0] == 200
        assert post(url, key, chat([user("text only")]))[0] == 200
        assert all("store_error" not in call for call in proxy.calls("bad"))  # control: all whole
    finally:
        stop_proxy(proxy)
    store["delete"](f"images/{sha(pngs[0])}")
    store["write"](f"images/{sha(pngs[1])}", pngs[2])  # bytes that do not hash to the name
    # A reader that starts now (the proxy verified these images once, and keeps them: an image is never replaced).
    for key, value in store["env"].items():
        monkeypatch.setenv(key, value)
    calls = asyncio.run(CallStore(store["url"]).read_calls("bad")).calls
    assert [call["images"] is None for call in calls] == [True, True, False, False]
    assert f"image {sha(pngs[0])} is not in the store" in calls[0]["store_error"]
    assert f"image {sha(pngs[1])} is stored with bytes that do not hash to its name" in calls[1]["store_error"]
    assert calls[2]["images"][0]["sha256"] == sha(pngs[2]) and calls[3]["images"] == []
    assert [call["prompt_token_ids"] is not None for call in calls] == [True] * 4  # the rest of each record reads


def test_1000_copies_of_one_screenshot_and_concurrent_rollouts_sending_it_store_it_once_and_whole(upstream, tmp_path):
    png = screenshot(20)
    root = tmp_path / "store"
    proxies = [start_proxy(upstream.url, str(root), ADMIN, log_path=tmp_path / f"proxy-{n}.log") for n in range(2)]
    try:
        rollout = proxies[0].register("copies")
        small = screenshot(21, size=(64, 40))
        status, _ = post(f"{rollout['openai_base_url']}/chat/completions", rollout["api_key"],
                         chat([user("many", *[small] * 1000)]))
        assert status == 200
        (record,) = local_log(root, "copies")
        assert base64.b64encode(small) not in record  # the request holds names, one image is stored
        assert len(orjson.loads(record)["images"]) == 1000

        async def rollouts():  # two proxies on one store, 16 rollouts sending the same new screenshot at once
            registered = [proxies[n % 2].register(f"c{n}") for n in range(16)]
            async with httpx.AsyncClient(timeout=120) as client:
                answers = await asyncio.gather(*(client.post(
                    f"{r['openai_base_url']}/chat/completions", json=chat([user("same", png)]),
                    headers={"authorization": f"Bearer {r['api_key']}"}) for r in registered))
            return [a.status_code for a in answers]

        assert asyncio.run(rollouts()) == [200] * 16
    finally:
        for proxy in proxies:
            stop_proxy(proxy)
    assert sorted(os.listdir(root / "images")) == sorted([sha(png), sha(small)])  # no temporary file left
    assert (root / "images" / sha(png)).read_bytes() == png


def test_an_image_that_cannot_be_stored_fails_its_call_with_a_503_and_no_record_names_it(upstream, tmp_path):
    png, torn = screenshot(30), screenshot(31)
    root = tmp_path / "store"
    (root / "images" / sha(png)).mkdir(parents=True)  # the image's name is taken by a folder
    (root / "images" / sha(torn)).write_bytes(torn[:100])  # a torn leftover: the one thing replaced
    proxy = start_proxy(upstream.url, str(root), ADMIN, log_path=tmp_path / "proxy.log")
    try:
        rollout = proxy.register("fail")
        url, key = f"{rollout['openai_base_url']}/chat/completions", rollout["api_key"]
        status, body = post(url, key, chat([user("look", png)]))
        assert status == 503 and "could not store" in body["error"]["message"] and sha(png) in body["error"]["message"]
        assert local_log(root, "fail") == []
        assert post(url, key, chat([user("look", torn)]))[0] == 200
        assert (root / "images" / sha(torn)).read_bytes() == torn
        (root / "images" / sha(png)).rmdir()
        assert post(url, key, chat([user("look", png)]))[0] == 200  # control: the same call, once it can be
        calls = proxy.calls("fail")
    finally:
        stop_proxy(proxy)
    assert [(c["call_index"], [ref["sha256"] for ref in c["images"]]) for c in calls] == [(0, [sha(torn)]), (1, [sha(png)])]
    assert all("store_error" not in call for call in calls)


def test_a_record_whose_image_names_are_not_sha256_is_read_with_a_store_error_and_no_path_followed(upstream, tmp_path):
    root = tmp_path / "store"
    proxy = start_proxy(upstream.url, str(root), ADMIN, log_path=tmp_path / "proxy.log")
    try:
        rollout = proxy.register("names")
        assert post(f"{rollout['openai_base_url']}/chat/completions", rollout["api_key"], chat([user("hi", screenshot(40))]))[0] == 200
        log = root / "rollouts" / "names" / "calls.jsonl"
        record = orjson.loads(log.read_bytes())
        record.update(call_index=1, images=[{"sha256": "../rollout.json", "media_type": "image/png", "width": 1, "height": 1}])
        log.write_bytes(log.read_bytes() + orjson.dumps(record) + b"\n")
        calls = proxy.calls("names")
    finally:
        stop_proxy(proxy)
    assert calls[0]["images"] is not None and calls[1]["images"] is None
    assert "images: not a list of image references" in calls[1]["store_error"]


def test_an_image_over_the_body_limit_is_a_413_and_nothing_is_stored(upstream, tmp_path):
    root = tmp_path / "store"
    big = screenshot(50, size=(4000, 4000))
    proxy = start_proxy(upstream.url, str(root), ADMIN, extra=["--max-body-bytes", str(len(big))],
                        log_path=tmp_path / "proxy.log")
    try:
        rollout = proxy.register("big")
        url, key = f"{rollout['openai_base_url']}/chat/completions", rollout["api_key"]
        assert post(url, key, chat([user("huge", big)]))[0] == 413
        assert post(url, key, chat([user("fits", screenshot(51, size=(64, 64)))]))[0] == 200  # control
    finally:
        stop_proxy(proxy)
    assert len(os.listdir(root / "images")) == 1


def _escaped(text: str, payload: str, how: str) -> str:
    """A request's JSON text with the image payload escaped as some JSON encoders write it."""
    if how == "slashes":  # PHP's json_encode and others escape every `/` (base64 holds them too)
        return text.replace("/", "\\/")
    if how == "unicode-slashes":
        return text.replace("/", "\\u002F")
    if how == "unicode":  # every character of the payload as a \u escape
        return text.replace(f'"{payload}"', '"' + "".join(f"\\u{ord(c):04x}" for c in payload) + '"')
    return text


ESCAPES = ["none", "slashes", "unicode-slashes", "unicode"]


def test_an_image_sent_with_json_escapes_is_a_reference_in_the_stored_request(upstream, tmp_path):
    """However the harness's encoder escaped an image's payload, the stored request holds its name, not its bytes
    (an escaped payload stayed inline, stored whole with every call); `none` is the control."""
    png = screenshot(60)
    payloads = {"chat": data_url(png), "messages": base64.b64encode(png).decode()}
    bodies = {"chat": chat([user("look", png)]), "messages": {"model": "tiny", "max_tokens": 8, "messages": [
        {"role": "user", "content": [{"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                                  "data": payloads["messages"]}}]}]}}
    root = tmp_path / "store"
    proxy = start_proxy(upstream.url, str(root), ADMIN, log_path=tmp_path / "proxy.log")
    try:
        for dialect in bodies:
            for how in ESCAPES:
                rollout = proxy.register(f"{dialect}-{how}")
                url = (f"{rollout['anthropic_base_url']}/v1/messages" if dialect == "messages"
                       else f"{rollout['openai_base_url']}/chat/completions")
                text = _escaped(json.dumps(bodies[dialect]), payloads[dialect], how)
                assert (payloads[dialect] in text) == (how == "none")  # the payload is escaped as asked
                answer = httpx.post(url, content=text.encode(), timeout=60, headers={
                    "authorization": f"Bearer {rollout['api_key']}", "x-api-key": rollout["api_key"]})
                assert answer.status_code == 200, answer.text
                assert upstream.bodies[-1]["messages"][-1]["content"][-1]["image_url"]["url"] == data_url(png)
        calls = {(dialect, how): proxy.calls(f"{dialect}-{how}")[0] for dialect in bodies for how in ESCAPES}
    finally:
        stop_proxy(proxy)
    reference = REFERENCE_PREFIX + sha(png)
    for (dialect, how), call in calls.items():
        (record,) = local_log(root, f"{dialect}-{how}")
        plain = orjson.dumps(orjson.loads(record))  # its escapes undone: the image is not in it, in any form
        assert base64.b64encode(png)[:2000] not in plain and reference.encode() in plain, (dialect, how)
        part = call["request"]["messages"][0]["content"][-1]
        assert (part["image_url"]["url"] if dialect == "chat" else part["source"]["data"]) == reference, (dialect, how)
        assert [ref["sha256"] for ref in call["images"]] == [sha(png)]
    assert os.listdir(root / "images") == [sha(png)]


def counted_reads(fs, monkeypatch) -> list[str]:
    """The names of the images the filesystem reads from now on: a spy on the real filesystem (a local file's
    read, or one GET of the moto S3 server), which still does the reading."""
    reads = []
    if fs.async_impl:  # s3fs: `cat` gathers one `_cat_file` (a GET) per object
        original = fs._cat_file

        async def counted(path, *args, **kwargs):
            reads.append(path.rsplit("/", 1)[-1])
            return await original(path, *args, **kwargs)

        monkeypatch.setattr(fs, "_cat_file", counted)
    else:
        original = fs.cat_file

        def counted(path, *args, **kwargs):
            reads.append(path.rsplit("/", 1)[-1])
            return original(path, *args, **kwargs)

        monkeypatch.setattr(fs, "cat_file", counted)
    return reads


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_reader_downloads_and_hashes_each_image_once_however_many_calls_and_readers_name_it(where, tmp_path,
                                                                                             request, monkeypatch):
    if where == "s3":
        s3 = request.getfixturevalue("s3_server")
        for key, value in s3["env"].items():
            monkeypatch.setenv(key, value)
        url = f"s3://{s3['bucket']}/verified-{uuid.uuid4().hex[:8]}"
    else:
        url = str(tmp_path / "store")
    store = CallStore(url)
    first, second = (from_base64(base64.b64encode(screenshot(seed)).decode(), "image/png", "f") for seed in (80, 81))
    store.images.put([first, second])

    def rollouts() -> list[dict]:  # two rollouts' calls naming the same screenshots (a task's first page, say)
        return [{"images": [first.reference(), second.reference()]}, {"images": [second.reference()]}]

    def reader(**options) -> ImageStore:
        return ImageStore(store.fs, store.root, store.local, store.create_only, **options)

    reads = counted_reads(store.fs, monkeypatch)
    images = reader()
    assert all("store_error" not in call for call in images.check(rollouts()))
    images.check(rollouts())
    assert images.read(first.sha256) == screenshot(80)
    assert sorted(reads) == sorted([first.sha256, second.sha256])  # each downloaded (and hashed) once

    reads.clear()  # the control: a reader that keeps nothing downloads every image at every read
    blind = reader(cache_bytes=0)
    for _ in range(2):
        blind.check(rollouts())
    blind.read(first.sha256)
    assert len(reads) == 5

    reads.clear()  # eight readers checking them at once: one download each, the others wait for it
    images = reader()
    with ThreadPoolExecutor(8) as pool:
        checked = list(pool.map(lambda _: images.check(rollouts()), range(8)))
    assert sorted(reads) == sorted([first.sha256, second.sha256])
    assert all("store_error" not in call for calls in checked for call in calls)

    # Still hash-checked: a reader finds bytes that do not hash to their name, and keeps nothing of them.
    store.fs.pipe_file(store.images.path(first.sha256), screenshot(82))
    reads.clear()
    altered = ImageStore.reader(f"{url}/images")  # as the update would read them, from the run's image folder
    for _ in range(2):
        (call, _other) = altered.check(rollouts())
        assert call["images"] is None and f"image {first.sha256} is stored with bytes that" in call["store_error"]
        with pytest.raises(ImageUnreadable, match="do not hash to its name"):
            altered.read(first.sha256)
    assert reads.count(first.sha256) == 4 and reads.count(second.sha256) == 1
