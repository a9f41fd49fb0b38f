"""OpenAIChatModel and OpenAIEmbedder against a real HTTP server on loopback."""
import base64
import io
import socket
import threading
import wave

import numpy as np
import pytest

from m3mem.errors import ConfigError, ModelError
from models.chat_openai import OpenAIChatModel, parse_endpoint
from models.text_openai import OpenAIEmbedder
from tests.helpers.openai_server import OpenAIServer, Reply, hash_vector

NO_ENV: dict = {}


@pytest.fixture
def server():
    with OpenAIServer() as s:
        yield s


class Sleeps(list):
    """Stands in for time.sleep: records each wait instead of waiting."""

    def __call__(self, seconds: float) -> None:
        self.append(seconds)


def make_model(server, query="model=m", env=NO_ENV, **_):
    model = OpenAIChatModel(f"{server.url}?{query}", device="cpu", env=env)
    model.client.sleep = Sleeps()
    return model


def user(text):
    return [{"role": "user", "content": text}]


# ---------------------------------------------------------------- happy path

def test_chat_returns_reply_and_sends_model_and_sampling(server):
    server.script(Reply.chat("Action: [Answer]\nContent: Alice"))
    model = make_model(server)
    assert model.chat(user("who?"), temperature=0.3, max_new_tokens=64) == "Action: [Answer]\nContent: Alice"
    (req,) = server.chat_requests()
    assert req.body["model"] == "m"
    assert req.body["temperature"] == 0.3 and req.body["max_tokens"] == 64
    assert req.body["messages"] == [{"role": "user", "content": "who?"}]
    assert "Authorization" not in req.headers


def test_api_key_header_prefers_m3mem_variable(server):
    model = make_model(server, env={"M3MEM_OPENAI_API_KEY": "k-m3", "OPENAI_API_KEY": "k-openai"})
    model.chat(user("hi"))
    assert server.requests[-1].headers["Authorization"] == "Bearer k-m3"
    model = make_model(server, env={"OPENAI_API_KEY": "k-openai"})
    model.chat(user("hi"))
    assert server.requests[-1].headers["Authorization"] == "Bearer k-openai"


def test_model_from_env_and_from_server_listing(server):
    make_model(server, query="", env={"M3MEM_OPENAI_MODEL": "from-env"}).chat(user("a"))
    assert server.chat_requests()[-1].body["model"] == "from-env"
    model = make_model(server, query="")
    model.chat(user("b"))
    assert model.model == "test-model"
    assert server.chat_requests()[-1].body["model"] == "test-model"
    assert [r.method for r in server.requests[-2:]] == ["GET", "POST"]


def _decode_data_url(url: str) -> np.ndarray:
    from PIL import Image

    head, b64 = url.split(",", 1)
    assert head == "data:image/jpeg;base64"
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(b64))).convert("RGB"))


def test_image_parts_arrive_as_jpeg_data_urls(server):
    red = np.zeros((40, 60, 3), np.uint8)
    red[..., 0] = 255
    model = make_model(server)
    model.chat([{"role": "user", "content": [{"type": "text", "text": "<face_1>:"}, {"type": "image", "image": red}]}])
    parts = server.chat_requests()[-1].body["messages"][0]["content"]
    assert parts[0] == {"type": "text", "text": "<face_1>:"}
    assert parts[1]["type"] == "image_url"
    img = _decode_data_url(parts[1]["image_url"]["url"])
    assert img.shape == (40, 60, 3)
    assert img[..., 0].mean() > 240 and img[..., 1].mean() < 15


def test_video_is_sent_as_labelled_sampled_frames(server):
    frames = [np.full((16, 16, 3), 10 * i, np.uint8) for i in range(20)]
    model = make_model(server, query="model=m&max_frames=4")
    model.chat([{"role": "user", "content": [{"type": "video", "frames": frames, "fps": 2.0}]}])
    parts = server.chat_requests()[-1].body["messages"][0]["content"]
    labels = [p["text"] for p in parts if p["type"] == "text"]
    images = [_decode_data_url(p["image_url"]["url"]) for p in parts if p["type"] == "image_url"]
    assert labels == ["[frame at 0.0 s]", "[frame at 3.0 s]", "[frame at 6.5 s]", "[frame at 9.5 s]"]
    # the frames sent are the frames at those times (frame i has grey level 10 i)
    assert [int(round(im.mean() / 10)) for im in images] == [0, 6, 13, 19]


def test_audio_goes_as_input_audio_wav_or_is_dropped(server):
    sr = 8000
    tone = (0.5 * np.sin(2 * np.pi * 440 * np.arange(sr) / sr)).astype(np.float32)
    msg = [{"role": "user", "content": [{"type": "text", "text": "listen"}, {"type": "audio", "audio": tone, "sr": sr}]}]
    make_model(server).chat(msg)
    part = server.chat_requests()[-1].body["messages"][0]["content"][1]
    assert part["type"] == "input_audio" and part["input_audio"]["format"] == "wav"
    with wave.open(io.BytesIO(base64.b64decode(part["input_audio"]["data"]))) as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (16000, 1, 2)
        assert w.getnframes() == 16000  # one second, resampled to 16 kHz
    make_model(server, query="model=m&audio=0").chat(msg)
    assert server.chat_requests()[-1].body["messages"][0]["content"] == "listen"


# ---------------------------------------------------------------- retries and errors

def test_500_then_good_is_retried_with_growing_backoff(server):
    server.script(Reply.error(500), Reply.error(503), Reply.chat("fine"))
    model = make_model(server)
    assert model.chat(user("x")) == "fine"
    assert len(server.chat_requests()) == 3
    first, second = model.client.sleep
    # equal jitter: wait n lies in [b 2^n / 2, b 2^n] for base b = 0.5 s
    assert 0.25 <= first <= 0.5 and 0.5 <= second <= 1.0


def test_429_retry_after_is_honoured(server):
    server.script(Reply.error(429, headers={"Retry-After": "7"}), Reply.chat("after wait"))
    model = make_model(server)
    assert model.chat(user("x")) == "after wait"
    assert model.client.sleep == [7.0]


def test_retry_after_longer_than_we_wait_fails_at_once(server):
    server.script(Reply.error(429, headers={"Retry-After": "3600"}))
    model = make_model(server)
    with pytest.raises(ModelError, match="retry after 3600 s"):
        model.chat(user("x"))
    assert len(server.chat_requests()) == 1 and model.client.sleep == []


def test_retries_exhausted_names_url_and_status(server):
    server.script(*[Reply.error(503, "overloaded")] * 3)
    model = make_model(server, query="model=m&retries=2")
    with pytest.raises(ModelError) as e:
        model.chat(user("x"))
    msg = str(e.value)
    assert f"{server.url}/chat/completions" in msg and "HTTP 503" in msg and "3 attempt" in msg
    assert len(server.chat_requests()) == 3


def test_client_errors_are_not_retried(server):
    server.script(Reply.error(401, "bad key"))
    model = make_model(server)
    with pytest.raises(ModelError, match="HTTP 401.*M3MEM_OPENAI_API_KEY"):
        model.chat(user("x"))
    assert len(server.chat_requests()) == 1


def test_malformed_replies_raise_model_error(server):
    server.script(Reply(body="this is not json"), Reply(body={"object": "chat.completion"}), Reply.chat(None))
    model = make_model(server)
    with pytest.raises(ModelError, match="not JSON"):
        model.chat(user("x"))
    with pytest.raises(ModelError, match="without choices"):
        model.chat(user("x"))
    with pytest.raises(ModelError, match="no text"):
        model.chat(user("x"))


def test_slow_server_times_out_without_retry(server):
    server.script(Reply.chat("too late", delay_s=5.0))
    model = make_model(server, query="model=m&timeout_s=0.3")
    with pytest.raises(ModelError, match="timed out after 0.3 s"):
        model.chat(user("x"))
    assert len(server.chat_requests()) == 1


def test_connection_refused_is_retried_then_fails():
    with socket.socket() as s:  # a port that nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    model = OpenAIChatModel(f"http://127.0.0.1:{port}/v1?model=m&retries=2", device="cpu", env=NO_ENV)
    model.client.sleep = Sleeps()
    with pytest.raises(ModelError, match="cannot connect"):
        model.chat(user("x"))
    assert model.client.attempts == 3 and len(model.client.sleep) == 2


def test_concurrency_limit_is_respected_across_threads(server):
    def run(model, n):
        server.script(*[Reply.chat("ok", delay_s=0.3)] * n)
        threads = [threading.Thread(target=model.chat, args=(user(str(i)),)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    run(make_model(server, query="model=m&concurrency=2"), 6)
    assert server.peak_in_flight == 2
    # two model objects on one endpoint share its process-wide limit
    a = make_model(server, query="model=a&concurrency=2")
    b = make_model(server, query="model=b&concurrency=2")
    assert a.client.semaphore is b.client.semaphore


def test_without_a_limit_the_server_sees_parallel_requests():
    # the control for the test above: the server can see more than two at once
    with OpenAIServer() as server:
        model = make_model(server, query="model=m&concurrency=8")
        server.script(*[Reply.chat("ok", delay_s=0.3)] * 6)
        threads = [threading.Thread(target=model.chat, args=(user(str(i)),)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert server.peak_in_flight > 2


def test_chat_batch_keeps_order(server):
    model = make_model(server)
    assert model.chat_batch([user("one"), user("two"), user("three")]) == ["echo: one", "echo: two", "echo: three"]


# ---------------------------------------------------------------- config string

def test_parse_endpoint_params_env_and_passthrough():
    ep = parse_endpoint("http://h:8000/v1/?model=M3-Agent-Control&timeout_s=60&api-version=2024-02&audio=no",
                        env={"M3MEM_OPENAI_CONCURRENCY": "3", "M3MEM_OPENAI_TIMEOUT_S": "5"})
    assert ep.base_url == "http://h:8000/v1" and ep.model == "M3-Agent-Control"
    assert ep.timeout_s == 60.0 and ep.concurrency == 3 and ep.audio is False
    assert ep.url("chat/completions") == "http://h:8000/v1/chat/completions?api-version=2024-02"


@pytest.mark.parametrize("spec", ["ftp://h/v1", "localhost:8000", "http://h/v1?timeout_s=abc",
                                  "http://h/v1?concurrency=0", "http://h/v1?audio=maybe"])
def test_parse_endpoint_rejects_bad_specs(spec):
    with pytest.raises(ConfigError):
        parse_endpoint(spec, env=NO_ENV)


def test_registry_builds_openai_backends(server):
    from models.registry import load

    chat = load("chat", f"openai:{server.url}?model=reg", device="cpu")
    assert isinstance(chat, OpenAIChatModel) and chat.endpoint.model == "reg"
    text = load("text", f"openai:{server.url}?model=emb", device="cpu")
    assert isinstance(text, OpenAIEmbedder)


# ---------------------------------------------------------------- embeddings

def test_embedder_normalises_batches_and_learns_dim():
    with OpenAIServer(embedding_dim=12) as server:
        emb = OpenAIEmbedder(f"{server.url}?model=e&batch_size=3", device="cpu", env=NO_ENV)
        texts = [f"text {i}" for i in range(7)]
        vecs = emb.embed(texts)
        assert vecs.shape == (7, 12) and vecs.dtype == np.float32 and emb.dim == 12
        assert np.allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)
        expected = hash_vector("text 5", 12)
        assert np.allclose(vecs[5], expected / np.linalg.norm(expected), atol=1e-5)
        posts = [r for r in server.requests if r.path.endswith("/embeddings")]
        assert [len(r.body["input"]) for r in posts] == [3, 3, 1]
        assert all(r.body["model"] == "e" for r in posts)


def test_embedder_dim_probe_and_out_of_order_data(server):
    emb = OpenAIEmbedder(f"{server.url}?model=e", device="cpu", env=NO_ENV)
    assert emb.dim == 16  # one probe request
    assert len(server.requests) == 1
    reply = Reply.embeddings([[0, 1], [1, 0]])
    reply.body["data"].reverse()  # servers may return data out of order; index decides
    server.script(reply, kind="embeddings")
    emb2 = OpenAIEmbedder(f"{server.url}?model=e&dim=2", device="cpu", env=NO_ENV)
    assert np.allclose(emb2.embed(["a", "b"]), [[0, 1], [1, 0]])


def test_embedder_rejects_wrong_dim_and_count(server):
    emb = OpenAIEmbedder(f"{server.url}?model=e&dim=8", device="cpu", env=NO_ENV)
    with pytest.raises(ModelError, match="16-d vectors, expected 8"):
        emb.embed(["a"])
    server.script(Reply.embeddings([[1.0, 0.0]]), kind="embeddings")
    with pytest.raises(ModelError, match="1 vectors for 2 texts"):
        OpenAIEmbedder(f"{server.url}?model=e", device="cpu", env=NO_ENV).embed(["a", "b"])


def test_embedder_empty_input_sends_nothing():
    with OpenAIServer(embedding_dim=4) as server:
        emb = OpenAIEmbedder(f"{server.url}?model=e&dim=4", device="cpu", env=NO_ENV)
        assert emb.embed([]).shape == (0, 4)
        assert server.requests == []
        assert emb.embed(["", "x"]).shape == (2, 4)
        assert server.requests[-1].body["input"] == [" ", "x"]  # servers reject empty strings
