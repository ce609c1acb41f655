"""Kill -9 and resume, through the real command line: for sft, rm and dpo a run is SIGKILLed at
a random moment after its first checkpoint, resumed with --resume, and must end with
bit-identical weights and identical metrics.jsonl rows (wall-clock keys aside) to the same run
left alone. A run killed in the middle of writing a checkpoint, and runs whose newest checkpoint
is torn or corrupt, resume from the previous checkpoint to the same result; SIGTERM from outside
saves a checkpoint and exits 143 with a one-line message.

The killed run is a subprocess (``python -m proxrl ...``); the uninterrupted run runs in this
process (one thread, as the subprocess) while the killed one runs beside it, and the resume runs
here too, so only the killed run pays a Python start-up and the state crosses processes through
the checkpoint alone.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from proxrl.cli import main
from proxrl.runtime.checkpoint import CheckpointManager
from tests.algos.lm_tasks import preference_rows, sft_rows, write_jsonl

VOLATILE = ("time/", "perf/")
ENV = {
    **os.environ,
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "TOKENIZERS_PARALLELISM": "false",
}

# A run long enough (300 optimizer steps of a 32-wide model, about 1.5 s) that a kill shortly
# after the first checkpoint (step 10) always lands mid-training.
TRAINERS = {
    "sft": ("sft", dict(learning_rate=1e-3, epochs=38)),
    "rm": ("pairs", dict(learning_rate=1e-3, epochs=38, eval_fraction=0.125)),
    "dpo": ("pairs", dict(learning_rate=1e-3, epochs=38)),
}


def _write_config(tmp_path: Path, command: str, tiny_lm: str, **extra) -> Path:
    kind, fields = TRAINERS[command]
    rows = sft_rows(64, seed=0) if kind == "sft" else preference_rows(64, seed=0)
    data = write_jsonl(tmp_path / f"{kind}.jsonl", rows)
    values = (
        dict(
            model=tiny_lm,
            data=data,
            batch_size=8,
            save_every=10,
            keep_checkpoints=2,
            progress=False,
        )
        | fields
        | extra
    )
    path = tmp_path / f"{command}.yaml"
    path.write_text("".join(f"{k}: {json.dumps(v)}\n" for k, v in values.items()))
    return path


def _launch(argv: list[str], prelude: str = "") -> subprocess.Popen:
    """``python -m proxrl ARGV`` (or, with a prelude, the same after running it)."""
    if prelude:
        code = prelude + "\nfrom proxrl.cli import main\nraise SystemExit(main(sys.argv[1:]))\n"
        cmd = [sys.executable, "-c", code, *argv]
    else:
        cmd = [sys.executable, "-m", "proxrl", *argv]
    return subprocess.Popen(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_checkpoint(process: subprocess.Popen, run: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not any((run / "checkpoints").glob("step_*/manifest.json")):
        assert process.poll() is None, process.communicate()[1]
        assert time.monotonic() < deadline, "no checkpoint appeared"
        time.sleep(0.002)


def _rows(run: Path) -> list[dict]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.startswith(VOLATILE)} for r in rows]


def _assert_same_run(a: Path, b: Path) -> None:
    names = sorted(p.name for p in a.glob("*.safetensors"))
    assert names == sorted(p.name for p in b.glob("*.safetensors")) and names
    for name in names:
        wa, wb = load_file(str(a / name)), load_file(str(b / name))
        assert wa.keys() == wb.keys()
        for key in wa:
            assert torch.equal(wa[key], wb[key]), f"{name}:{key}"
    assert json.loads((a / "config.json").read_text()) == json.loads(
        (b / "config.json").read_text()
    )
    ra, rb = _rows(a), _rows(b)
    assert [r["step"] for r in rb] == list(range(1, len(rb) + 1))
    assert ra == rb


def _straight(command: str, config: Path, run: Path, capsys) -> None:
    assert main([command, "--config", str(config), "--output-dir", str(run)]) == 0, (
        capsys.readouterr().err
    )


def _resume(command: str, config: Path, run: Path, capsys) -> None:
    """``proxrl COMMAND --resume``, in this process: the state crosses from the killed process
    to this one only through the checkpoint on disk."""
    code = main([command, "--config", str(config), "--output-dir", str(run), "--resume"])
    assert code == 0, capsys.readouterr().err


@pytest.mark.parametrize("command", ["sft", "rm", "dpo"])
def test_sigkill_at_a_random_moment_then_resume_equals_the_uninterrupted_run(
    command, tiny_lm, tmp_path, capsys
):
    config = _write_config(tmp_path, command, tiny_lm)
    killed_run = tmp_path / "killed"
    process = _launch([command, "--config", str(config), "--output-dir", str(killed_run)])
    _straight(command, config, tmp_path / "straight", capsys)  # meanwhile, in this process

    _wait_for_checkpoint(process, killed_run)
    delay = random.uniform(0.0, 0.3)
    time.sleep(delay)
    process.kill()
    process.communicate()
    assert process.returncode == -signal.SIGKILL
    newest = CheckpointManager(killed_run).checkpoints()[-1]
    assert not (killed_run / "model.safetensors").exists(), (
        f"finished before the kill ({delay=:.3f})"
    )
    killed_at = CheckpointManager.step_of(newest)
    assert 10 <= killed_at < 300

    _resume(command, config, killed_run, capsys)
    _assert_same_run(tmp_path / "straight", killed_run)


# Dies (SIGKILL) half-way through writing the second checkpoint's weights: the temporary
# directory holds a truncated safetensors file and no manifest.
DIE_IN_SECOND_SAVE = textwrap.dedent("""
    import os, signal, sys
    import proxrl.runtime.checkpoint as checkpoint
    real_save_file, calls = checkpoint.save_file, [0]
    def save_file(tensors, path, *args, **kwargs):
        calls[0] += 1
        real_save_file(tensors, path, *args, **kwargs)
        if calls[0] == 2:
            with open(path, "r+b") as f:
                f.truncate(os.path.getsize(path) // 2)
            os.kill(os.getpid(), signal.SIGKILL)
    checkpoint.save_file = save_file
""")


def test_kill_while_writing_a_checkpoint_resumes_from_the_previous_one(tiny_lm, tmp_path, capsys):
    config = _write_config(tmp_path, "sft", tiny_lm, epochs=4)  # 32 steps, checkpoints 10, 20, 30
    run = tmp_path / "killed"
    process = _launch(
        ["sft", "--config", str(config), "--output-dir", str(run)], prelude=DIE_IN_SECOND_SAVE
    )
    _straight("sft", config, tmp_path / "straight", capsys)
    _, err = process.communicate()
    assert process.returncode == -signal.SIGKILL, err
    checkpoints = run / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == [
        f".tmp-step_000000020-{process.pid}",
        "step_000000010",
    ]
    assert not (checkpoints / f".tmp-step_000000020-{process.pid}" / "manifest.json").exists()

    _resume("sft", config, run, capsys)
    _assert_same_run(tmp_path / "straight", run)
    # The torn temporary directory was cleaned up by the resumed run's first save.
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step_000000030", "step_000000032"]


def _truncate(path: Path) -> None:
    weights = path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])


def _flip_a_byte(path: Path) -> None:
    weights = path / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))


def _drop_manifest(path: Path) -> None:
    (path / "manifest.json").unlink()


def _drop_state(path: Path) -> None:
    (path / "state.pt").unlink()


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (_truncate, "model.safetensors does not match its sha256 in manifest.json"),
        (_flip_a_byte, "model.safetensors does not match its sha256 in manifest.json"),
        (_drop_manifest, "no manifest.json (the save did not finish)"),
        (_drop_state, "state.pt is missing"),
    ],
)
def test_torn_or_corrupt_newest_checkpoint_is_skipped_on_resume(
    damage, reason, tiny_lm, tmp_path, capsys
):
    """In-process: the killed run is the straight run cut back to its first checkpoints (the
    steps after it dropped), with its newest checkpoint damaged."""
    config = _write_config(tmp_path, "sft", tiny_lm, epochs=4, keep_checkpoints=4)
    straight, run = tmp_path / "straight", tmp_path / "damaged"
    _straight("sft", config, straight, capsys)
    shutil.copytree(straight, run)
    for name in ("model.safetensors", "config.json"):
        (run / name).unlink()
    shutil.rmtree(run / "checkpoints" / "step_000000030")
    shutil.rmtree(run / "checkpoints" / "step_000000032")
    newest = run / "checkpoints" / "step_000000020"
    damage(newest)

    with pytest.warns(
        UserWarning, match=re.escape(f"skipping corrupt checkpoint {newest}: {reason}")
    ):
        assert main(["sft", "--config", str(config), "--output-dir", str(run), "--resume"]) == 0
    _assert_same_run(straight, run)


def test_sigterm_from_outside_saves_exits_143_and_resumes_exactly(tiny_lm, tmp_path, capsys):
    config = _write_config(tmp_path, "sft", tiny_lm, save_every=0)
    run = tmp_path / "stopped"
    process = _launch(
        ["sft", "--config", str(config), "--output-dir", str(run), "--save-every", "25"]
    )
    _straight("sft", config, tmp_path / "straight", capsys)
    _wait_for_checkpoint(process, run)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate()
    assert process.returncode == 143, err
    last = err.strip().splitlines()[-1]
    assert last.startswith(
        f"proxrl sft: stopped: received SIGTERM; checkpoint saved in {run / 'checkpoints'}/step_"
    )
    assert last.endswith("; continue with --resume")
    saved = Path(last.split("checkpoint saved in ")[1].split(";")[0])
    assert CheckpointManager.verify(saved) is None and not (run / "model.safetensors").exists()

    _resume("sft", config, run, capsys)
    _assert_same_run(tmp_path / "straight", run)
