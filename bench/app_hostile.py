"""A victim's wait on the served app, alone and while two hostile tabs attack it (issue 64).

    python bench/app_hostile.py [--attacks headers,templates,alias,render] [--settle 5]
                                [--json OUT.json]

Launches ``app.py`` (served mode, the embedded demo) in its own process, pointed at a fake Hub on
loopback (``tests/fake_hub.FakeHub``) that serves the hostile repositories of issue 64's
tests beside copies of the demo's experts, and drives it over HTTP with ``gradio_client`` (the
machinery of ``bench/app_visitors.py``: each visitor its own page session and client address).
The victim picks the demo models (Check), builds the default swap (Build) and saves it (Save);
each is timed alone, then while two hostile tabs (two other addresses) repeat one attack:

* ``headers``: Check of a task expert whose three weight files are ~99 MiB safetensors headers
  (``tests/test_preflight._hostile_header``; High 2);
* ``templates``: Check of two experts whose chat templates are 30,000 lines each, difflib's slow
  case (``tests/test_tokenizer_panel._cycled_template``; High 3);
* ``alias``: an agent's ``layer_plan`` given a 9-level YAML alias bomb of ~480 characters
  (``tests/test_agents.alias_bomb``; High 1);
* ``render``: Chat with a task expert whose chat template runs two nested ``range(100000)``
  loops, or one of three items of the battery the renderer refuses (a string multiplied to a
  billion characters, a macro that calls itself, a ``join`` of huge ranges:
  ``tests/test_evaluate.TEMPLATE_BATTERY``); each hostile tab picks such an expert (pre-flight,
  then "Download and use"), builds the default swap and chats, again and again, moving on to
  the next template every few chats (High 4).

Printed per attack: the victim's Check, Build and Save seconds, how many attacks the hostile tabs
made and what they were answered (the distinct first lines, up to six). Target (issue 64): each wait within 10 s on a quiet machine.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from app_visitors import _args, connect, start_server, status  # noqa: E402

ATTACKS = ("headers", "templates", "alias", "render")
# the render attack's chat templates: the nested loops of issue 64, then three battery items
RENDER = ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
          "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}",
          "{{ ('a' * 1000000000)|length }}",
          "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
          "{% for i in range(100000) %}{{ range(100000)|join(',') }}{% endfor %}")
CHATS_PER_TEMPLATE = 3


def hostile_repos() -> dict[str, dict[str, bytes]]:
    """The fake Hub's repositories: the demo's experts as they are (``fake/task``,
    ``fake/lang``) and the hostile ones (``evil/headers``, ``evil/template-a`` and ``-b``,
    ``evil/render-0`` ... ``-3``: the task expert with a ``RENDER`` chat template). One bytes
    object stands for every copy of a file."""
    from layerswap_core.checkpoints.references import resolve
    from test_preflight import _hostile_header
    from test_tokenizer_panel import _cycled_template

    def files(ref: str) -> dict[str, bytes]:
        return {p.name: p.read_bytes() for p in sorted(resolve(ref).iterdir()) if p.is_file()}

    task, lang = files("embedded:smollm2-math-en"), files("embedded:smollm2-swahili")
    evil = _hostile_header(99 << 20)
    return {
        "fake/task": task, "fake/lang": lang,
        "evil/headers": {"config.json": task["config.json"],
                         **{f"model-0000{i}-of-00003.safetensors": evil for i in (1, 2, 3)}},
        "evil/template-a": {**task, "chat_template.jinja":
                            _cycled_template(30_000, 1).encode()},
        "evil/template-b": {**lang, "chat_template.jinja":
                            _cycled_template(30_000, 7).encode()},
        **{f"evil/render-{i}": {**task, "chat_template.jinja": t.encode()}
           for i, t in enumerate(RENDER)},
    }


def attack(name: str, url: str, address: str, stop: threading.Event, said: list,
           tab: int = 0) -> None:
    """One hostile tab: its attack again and again until ``stop`` (each answer's first line
    kept in ``said``)."""
    client = connect(url, address=address)
    if name == "render":
        return render_attack(client, tab, stop, said)
    if name == "alias":
        from test_agents import alias_bomb
        opened = json.loads(client.predict("", "embedded:smollm2-math-en",
                                           "embedded:smollm2-swahili", "",
                                           api_name="/check_models"))
        bomb = alias_bomb()
    while not stop.is_set():
        try:
            if name == "headers":
                out = client.predict(*_args(client, "/pick_models", {
                    "Base": "", "Task expert": "evil/headers", "Language expert": "fake/lang"}),
                    api_name="/pick_models")
            elif name == "templates":
                out = client.predict(*_args(client, "/pick_models", {
                    "Base": "", "Task expert": "evil/template-a",
                    "Language expert": "evil/template-b"}), api_name="/pick_models")
            else:
                out = client.predict(opened["session"], bomb, api_name="/layer_plan")
        except Exception as e:  # noqa: BLE001 - a refusal over the API is an exception
            out = f"error: {e}"
        said.append(first_line(out))


def render_attack(client, n: int, stop: threading.Event, said: list) -> None:
    """One hostile tab of the render attack: an expert with a ``RENDER`` template (the first tab
    starting at the nested loops, the second at the next one), downloaded, built, chatted with ``CHATS_PER_TEMPLATE`` times, then the next
    template's (each answer's first line kept in ``said``)."""
    for i in itertools.count(n):
        if stop.is_set():
            return
        picked = {"Base": "", "Task expert": f"evil/render-{i % len(RENDER)}",
                  "Language expert": "fake/lang"}
        try:
            client.predict(*_args(client, "/pick_models", picked), api_name="/pick_models")
            for _ in range(300):   # "Download and use" again until the download is in
                out = client.predict(*_args(client, "/download_models", picked),
                                     api_name="/download_models")
                if _value(out[1]).startswith("✔") or stop.is_set():
                    break
                time.sleep(2)
            client.predict(*_args(client, "/build", {}), api_name="/build")
        except Exception as e:  # noqa: BLE001 - a refusal over the API is an exception
            said.append(f"setup: {e}"[:160])
            continue
        for _ in range(CHATS_PER_TEMPLATE):
            if stop.is_set():
                return
            try:
                out = client.predict(*_args(client, "/chat", {"param_1": "Habari?",
                                                              "Max new tokens": 16}),
                                     api_name="/chat")
            except Exception as e:  # noqa: BLE001 - a refusal over the API is an exception
                out = f"error: {e}"
            said.append(first_line(out))


def _value(x) -> str:
    """An output's text (a plain value, or an update carrying one)."""
    x = x.get("value") if isinstance(x, dict) else x
    return x.strip() if isinstance(x, str) else ""


def first_line(out) -> str:
    """The first line of an answer: the Check's status or models text (its first two
    outputs: a text, or an update carrying one), else the answer itself."""
    for x in (out[:2] if isinstance(out, (list, tuple)) else [out]):
        x = x.get("value") if isinstance(x, dict) else x
        if isinstance(x, str) and x.strip():
            return x.strip().splitlines()[0][:160]
    return status(out)[:160]


def victim(url: str, address: str) -> dict:
    """A new visitor's Check (the demo models), Build (the default swap) and Save: seconds."""
    client = connect(url, address=address)
    times = {}
    t = time.perf_counter()
    client.predict(*_args(client, "/pick_models", {}), api_name="/pick_models")
    times["check_s"] = time.perf_counter() - t
    t = time.perf_counter()
    client.predict(*_args(client, "/build", {}), api_name="/build")
    times["build_s"] = time.perf_counter() - t
    t = time.perf_counter()
    out = client.predict(*_args(client, "/save", {"Save as": "victim",
                                                  "Overwrite": True}), api_name="/save")
    times["save_s"] = time.perf_counter() - t
    return {**{k: round(v, 2) for k, v in times.items()}, "save_status": status(out)[:100]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--attacks", default=",".join(ATTACKS))
    ap.add_argument("--settle", type=float, default=5.0,
                    help="seconds the hostile tabs attack (from their first answer) before the "
                         "victim starts")
    ap.add_argument("--port", type=int, default=7891)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    from fake_hub import FakeHub

    hub = FakeHub(hostile_repos())
    addresses = (f"198.19.0.{n}" for n in itertools.count(1))
    server = start_server(ROOT, a.port, {"HF_HUB_OFFLINE": "0", "HF_ENDPOINT": hub.url})
    url = f"http://127.0.0.1:{a.port}/"
    result = {"machine": f"{os.cpu_count()} CPUs", "date": time.strftime("%Y-%m-%d %H:%M"),
              "rows": []}
    try:
        connect(url)
        row = {"attack": "none", **victim(url, next(addresses))}
        result["rows"].append(row)
        print(json.dumps(row), flush=True)
        for name in (x.strip() for x in a.attacks.split(",") if x.strip()):
            stop, said = threading.Event(), []
            tabs = [threading.Thread(target=attack, args=(name, url, next(addresses), stop, said,
                                                          k), daemon=True) for k in range(2)]
            for tab in tabs:
                tab.start()
            t = time.monotonic()   # the first answer in (render: after the setup), then settle
            while not said and time.monotonic() - t < 600:
                time.sleep(0.5)
            time.sleep(a.settle)
            row = {"attack": name, **victim(url, next(addresses))}
            stop.set()
            for tab in tabs:
                tab.join(120)
            row.update({"hostile_calls": len(said), "hostile_answers": sorted(set(said))[:6],
                        "hostile_tabs_still_running": sum(t.is_alive() for t in tabs),
                        "hub_bytes_sent": sum(hub.sent.values())})
            hub.reset()
            result["rows"].append(row)
            print(json.dumps(row), flush=True)
    finally:
        server.terminate()
        server.wait(timeout=60)
        hub.close()
    print(json.dumps(result, indent=1))
    if a.json:
        a.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    threading.stack_size(8 << 20)
    sys.exit(main())
