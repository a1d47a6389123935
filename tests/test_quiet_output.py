"""Quiet by default: `hospitrust simulate` leaves out Ray's tip, torch's script_method deprecation and
Flower's install line, and colour codes when piped; `-v` shows the stream as Flower sends it."""

from __future__ import annotations

import io

from hospitrust.cli import main as cli
from hospitrust.cli import simulate as simulate_command
from hospitrust.ops.simulate import copy_lines

G, R = "\x1b[92m", "\x1b[0m"
STREAM = (
    f"{G}INFO {R}:      Starting Flower Simulation\n"
    "Successfully installed hospitrust to /tmp/hospitrust-sim-abc/apps/hospitrust.hospitrust.0.1.0.6170c3eb.\n"
    "/venv/lib/python3.11/site-packages/ray/_private/worker.py:2051: FutureWarning: Tip: In future versions of Ray, "
    "Ray will no longer override accelerator visible devices env var if num_gpus=0\n"
    "  warnings.warn(\n"
    f"{G}INFO {R}:      hospitrust: 4 hospitals\n"
    "(ClientAppActor pid=4242) /venv/lib/python3.11/site-packages/torch/jit/_script.py:366: DeprecationWarning: "
    "`torch.jit.script_method` is deprecated. Please switch to `torch.compile` or `torch.export`.\n"
    "(ClientAppActor pid=4242)   warnings.warn(\n"
    "/venv/x.py:1: UserWarning: something a user should see\n"
    "  warnings.warn(\n"
    f"{G}INFO {R}:      round   1/1  bal-acc 0.5000\n"
    "(ClientAppActor pid=4242) \x1b[93mWARNING \x1b[0m:   Manually terminating ClientAppActor\n"
)


def _copy(**kwargs) -> str:
    out = io.StringIO()
    copy_lines(io.StringIO(STREAM), out, **kwargs)
    return out.getvalue()


def test_piped_output_has_no_noise_and_no_colour_codes():
    assert _copy(tty=False) == ("INFO :      Starting Flower Simulation\n"
                                "INFO :      hospitrust: 4 hospitals\n"
                                "/venv/x.py:1: UserWarning: something a user should see\n"
                                "  warnings.warn(\n"
                                "INFO :      round   1/1  bal-acc 0.5000\n")


def test_a_terminal_keeps_the_colours_and_verbose_keeps_everything():
    on_terminal = _copy(tty=True)
    assert f"{G}INFO {R}:      round   1/1" in on_terminal and "Tip: In future versions of Ray" not in on_terminal
    assert "script_method" not in on_terminal and "Successfully installed" not in on_terminal
    assert _copy(tty=False, verbose=True) == STREAM


def test_dash_v_reaches_simulate(monkeypatch):
    import hospitrust.ops.simulate as sim

    seen = {}

    def fake(**kwargs):
        seen.update(kwargs)
        return sim.COMPLETED, None

    monkeypatch.setattr(sim, "simulate", fake)
    monkeypatch.setattr(simulate_command, "_environment_problem", lambda: None)
    assert cli.main(["simulate", "-v"]) == 0 and seen["verbose"] is True
    assert cli.main(["simulate"]) == 0 and seen["verbose"] is False
