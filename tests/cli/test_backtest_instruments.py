"""README's training example, then its backtest: a model trained and promoted for ES alone is
what ``backtest --instruments ES --checkpoint promoted`` trades, and without ``--instruments``
the error says which instrument sets do have a promoted model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.cli import main
from agent.config import load_config
from feeds.config import InstrumentSpec, SynthConfig
from feeds.synth import write_synthetic
from tests.daemon.support import install_model, model_checkpoint

ES = InstrumentSpec(symbol="ES", instrument_id=1001, session_end="13:45")


def test_promoted_is_the_model_of_the_instruments_traded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    data_dir = tmp_path / "state"
    monkeypatch.setenv("TRADEAGENT_DATA_DIR", str(data_dir))
    data = tmp_path / "synth"
    write_synthetic(data, instruments=[ES], synth=SynthConfig(days=1), seed=5)  # `synth --instruments ES`
    es_only = tmp_path / "es.toml"
    es_only.write_text('[[feeds.instruments]]\nsymbol = "ES"\ninstrument_id = 1001\n')
    sha = install_model(
        load_config(es_only), *model_checkpoint()
    )  # what `train --instruments ES --promote` leaves
    backtest = ["backtest", "--data", str(data), "--checkpoint", "promoted", "--fast"]

    assert main([*backtest, "--out", str(tmp_path / "all")]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]  # after the log lines, if logging is on
    assert err == (
        f"tradeagent backtest: error: --checkpoint promoted: no promoted checkpoint for ES,NQ in {data_dir}; "
        "promoted there: ES; trade one of these sets with --instruments (e.g. --instruments ES), "
        "or pass a sha256 or a file"
    )
    assert not (tmp_path / "all").exists()

    assert main([*backtest, "--instruments", "ES", "--json", "--out", str(tmp_path / "es")]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["checkpoint_sha256"] == sha
    assert summary["instruments"] == ["ES"]
    assert (tmp_path / "es" / "summary.json").is_file()


def test_an_unconfigured_instrument_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(["backtest", "--data", str(tmp_path), "--instruments", "ES,CL", "--out", str(tmp_path / "o")])
        == 2
    )
    assert capsys.readouterr().err.strip() == (
        "tradeagent backtest: error: instrument(s) CL are not configured (known: ES, NQ)"
    )
