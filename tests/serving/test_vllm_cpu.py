"""A real vLLM server, started with the command line the operator renders for the cpu profile,
serves a tiny Gemma 4 exactly as transformers runs it, behind the API key from its Secret."""

import secrets
import socket
from pathlib import Path

import pytest

from gemma_operator.devcluster import local_vllm
from gemma_operator.api import SecretKeyRef
from gemma_operator.children.vllm import VllmLaunch
from gemma_workloads import tiny

pytestmark = pytest.mark.slow

SERVED_NAME = "tiny-gemma"
KEY_REF = SecretKeyRef(name="vllm-api-key", key="token")
API_KEY = secrets.token_hex(16)
MAX_TOKENS = 24
PROMPT = "Q: What is the capital of France?\nA:"
MESSAGES = [{"role": "user", "content": "Which city is the capital of Japan?"}]
ENDPOINTS = {
    "completion": ("/v1/completions", {"prompt": PROMPT}),
    "chat": ("/v1/chat/completions", {"messages": MESSAGES}),
}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    # float32, so that both runtimes agree to ~1e-5. Random models tend to repeat one token;
    # with seed 3 both greedy continuations vary (the chat one ends on <turn|>) and every top-2
    # logit margin is above 5e-3, far above that noise.
    return tiny.write_checkpoint(tmp_path_factory.mktemp("tiny-gemma"), dtype="float32", seed=3)


@pytest.fixture(scope="module")
def server(vllm_python, checkpoint, tmp_path_factory):
    port = local_vllm.free_port()
    launch = VllmLaunch(
        model=str(checkpoint.path), served_name=SERVED_NAME, device="cpu", dtype="float32",
        max_model_len=512, max_num_seqs=4, port=port, api_key_secret=KEY_REF,
    )  # fmt: skip
    log_path = tmp_path_factory.mktemp("vllm") / "server.log"
    secret_store = {(KEY_REF.name, KEY_REF.key): API_KEY}
    proc = local_vllm.start_rendered(launch, bin_dir=vllm_python.parent, log_path=log_path, secrets=secret_store)
    try:
        proc.wait_ready(SERVED_NAME, api_key=API_KEY, timeout=240)
    except RuntimeError as err:
        proc.stop()
        pytest.fail(f"vLLM did not start: {err}")
    yield proc
    proc.stop()
    assert not local_vllm.group_alive(proc.proc.pid), "vLLM processes left behind"
    with socket.socket() as sock:  # with SO_REUSEADDR, bind fails only while someone listens
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("0.0.0.0", port))


@pytest.fixture(scope="module")
def reference(checkpoint):
    """transformers' greedy continuations of the prompt and of the chat: (prompt ids, new ids)."""
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(checkpoint.path)
    model = AutoModelForCausalLM.from_pretrained(checkpoint.path, dtype=torch.float32).eval()
    chat_ids = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, return_dict=True)["input_ids"]
    result = {}
    for name, prompt_ids in (("completion", tokenizer(PROMPT)["input_ids"]), ("chat", list(chat_ids))):
        with torch.no_grad():
            out = model.generate(torch.tensor([prompt_ids]), max_new_tokens=MAX_TOKENS, do_sample=False)
        result[name] = (prompt_ids, out[0, len(prompt_ids):].tolist())
    return result


def post(server, path, body, api_key=API_KEY):
    return local_vllm.request(f"{server.base_url}{path}", body, api_key=api_key)


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_greedy_output_equals_transformers(server, reference, endpoint):
    path, inputs = ENDPOINTS[endpoint]
    prompt_ids, expected = reference[endpoint]
    request = {"model": SERVED_NAME, **inputs, "max_tokens": MAX_TOKENS, "temperature": 0, "return_token_ids": True}
    status, body = post(server, path, request)
    assert status == 200, body
    choice = body["choices"][0]
    # Completions report the prompt's ids per choice, chat completions once per response.
    served_prompt = choice.get("prompt_token_ids") or body.get("prompt_token_ids")
    assert served_prompt == prompt_ids, "the prompt (or the chat template) was tokenized differently"
    assert choice["token_ids"] == expected
    assert len(set(expected)) >= 5, f"too uniform to compare: {expected}"


def test_api_key_from_the_secret_is_enforced(server):
    request = {"model": SERVED_NAME, "prompt": PROMPT, "max_tokens": 2}
    assert post(server, "/v1/completions", request, api_key=None)[0] == 401
    assert post(server, "/v1/completions", request, api_key="wrong")[0] == 401
    assert post(server, "/v1/completions", request)[0] == 200
    cmdline = Path(f"/proc/{server.proc.pid}/cmdline").read_bytes()
    assert API_KEY.encode() not in cmdline, "the API key must not be on the command line"
