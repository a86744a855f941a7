"""One registry per kind: built-ins, entry-point plug-ins and import strings (no Ray)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from raysearch.cli.commands import main
from raysearch.losses import build_loss, loss_parameters
from raysearch.registry import (
    ENTRY_POINT_GROUPS,
    Registry,
    RegistryError,
    code_module,
    import_object,
    is_import_string,
    object_label,
)
from raysearch.training.models import build_model
from raysearch.training.registries import registry

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "tabular_calib"


def _write_pkg(root: Path, name: str = "userpkg") -> Path:
    pkg = root / name
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "things.py").write_text(textwrap.dedent("""
        import torch
        from torch import nn

        class Net(nn.Module):
            def __init__(self, n_in, k, hidden):
                super().__init__()
                self.body = nn.Linear(n_in, hidden)
                self.head = nn.Linear(hidden, k)

            def forward(self, x):
                return self.head(self.body(x.flatten(1)))

        def make_net(num_classes, input_shape, hidden=16):
            return Net(int(torch.tensor(input_shape).prod()), num_classes, hidden)

        def raises(num_classes, input_shape):
            raise ZeroDivisionError("the user's bug")

        def not_a_module(num_classes, input_shape):
            return {"weights": 1}

        class Half(nn.Module):
            def __init__(self, scale=0.5):
                super().__init__()
                self.scale = scale

            def forward(self, logits, targets):
                return self.scale * nn.functional.cross_entropy(logits, targets)
        """))
    return pkg


@pytest.fixture
def user_pkg(tmp_path, monkeypatch):
    """A package in a folder of its own, importable from the current directory (not installed)."""
    _write_pkg(tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))  # restores sys.path afterwards
    yield tmp_path
    for name in [m for m in sys.modules if m == "userpkg" or m.startswith("userpkg.")]:
        del sys.modules[name]


def test_import_strings(user_pkg):
    assert is_import_string("userpkg.things:make_net")
    assert not is_import_string("resnet20")
    assert not is_import_string("a:b:c")
    assert not is_import_string("torchvision: resnet18")
    factory = import_object("userpkg.things:make_net")
    model = build_model("userpkg.things:make_net", num_classes=3, input_shape=(4,), hidden=7)
    assert model.body.out_features == 7  # the factory's own keyword reached the model
    assert callable(factory)
    assert object_label(factory) == "userpkg.things:make_net"
    assert code_module(factory) == str(user_pkg / "userpkg")  # what a cluster is shipped
    loss = build_loss("userpkg.things:Half", scale=0.25)
    assert loss.scale == 0.25
    assert loss_parameters("userpkg.things:Half") == {"scale": 0.5}


def test_import_string_errors_are_one_line(user_pkg):
    with pytest.raises(RegistryError, match=r"cannot import module 'nopkg\.things' \(no module "
                                            r"named 'nopkg' in the current directory"):
        import_object("nopkg.things:make_net", what="model")
    with pytest.raises(RegistryError, match=r"'userpkg\.things' has no attribute 'make_nett'; "
                                            r"did you mean make_net\?"):
        import_object("userpkg.things:make_nett", what="model")
    with pytest.raises(ValueError, match=r"model 'userpkg\.things:raises' raised "
                                         r"ZeroDivisionError while being built .*the user's bug"):
        build_model("userpkg.things:raises", num_classes=3, input_shape=(4,))
    with pytest.raises(ValueError, match=r"model 'userpkg\.things:not_a_module' returned dict, "
                                         r"expected a torch\.nn\.Module"):
        build_model("userpkg.things:not_a_module", num_classes=3, input_shape=(4,))
    with pytest.raises(ValueError, match=r"model 'userpkg\.things:make_net' takes no argument "
                                         r"'width'; it takes: hidden"):
        build_model("userpkg.things:make_net", num_classes=3, input_shape=(4,), width=3)
    with pytest.raises(ValueError, match=r"loss 'userpkg\.things:Half' got unexpected "
                                         r"parameter\(s\) margin; accepted: scale"):
        build_loss("userpkg.things:Half", margin=1.0)
    broken = user_pkg / "userpkg" / "broken.py"
    broken.write_text("1 / 0\n")
    with pytest.raises(RegistryError, match=r"importing module 'userpkg\.broken' raised "
                                            r"ZeroDivisionError: division by zero"):
        import_object("userpkg.broken:x")


def test_unknown_name_suggests_and_lists_sources():
    with pytest.raises(ValueError, match="Unknown loss") as err:
        build_loss("acsl")
    message = str(err.value)
    assert message.startswith("Unknown loss 'acsl' (did you mean acls")
    assert "(built-in)" in message
    assert "import string package.module:attr" in message
    assert "\n" not in message


def _fake_dist(root: Path, dist: str, entries: dict[str, dict[str, str]]) -> None:
    """An installed distribution's metadata as pip writes it (dist-info with entry_points.txt)."""
    info = root / f"{dist}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    lines = []
    for group, names in entries.items():
        lines.append(f"[{group}]")
        lines += [f"{name} = {target}" for name, target in names.items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")


def test_entry_points_join_the_registry_and_clashes_name_both_sources(tmp_path, monkeypatch):
    _fake_dist(tmp_path, "alpha", {"raysearch.losses": {"halfce": "alpha_mod:Half"}})
    (tmp_path / "alpha_mod.py").write_text(
        "from torch import nn\n"
        "class Half(nn.Module):\n"
        "    def __init__(self, scale=0.5):\n"
        "        super().__init__(); self.scale = scale\n"
        "    def forward(self, logits, targets):\n"
        "        return self.scale * nn.functional.cross_entropy(logits, targets)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    reg = Registry("losses", {"ce": "raysearch.losses.classification:CrossEntropy"})
    assert reg.source("halfce") == "alpha 1.0"
    assert reg.names() == ["ce", "halfce"]
    assert reg.get("halfce")().scale == 0.5
    _fake_dist(tmp_path, "beta", {"raysearch.losses": {"ce": "beta_mod:Other"}})
    clash = (r"loss name 'ce' is declared twice: by built-in and by beta 1\.0 "
             r"\(entry-point group raysearch\.losses\)")
    with pytest.raises(RegistryError, match=clash):
        reg.get("ce")


def test_list_command_shows_sources():
    out = CliRunner().invoke(main, ["list", "losses"])
    assert out.exit_code == 0, out.output
    assert "acls" in out.output
    assert "built-in" in out.output
    assert "any import string package.module:attr works too" in out.output
    out = CliRunner().invoke(main, ["list", "gizmos"])
    assert out.exit_code == 2


def test_a_plugin_installed_with_pip_target_is_found_by_its_entry_point_names(tmp_path,
                                                                              tabular_plugin):
    """pip install --target DIR, DIR on PYTHONPATH: the short names work in a fresh process."""
    target = tabular_plugin
    elsewhere = tmp_path / "elsewhere"  # the package is not importable from the cwd
    elsewhere.mkdir()
    env = {**_env(), "PYTHONPATH": str(target)}
    listed = subprocess.run([sys.executable, "-m", "raysearch.cli", "list", "models"],
                            cwd=elsewhere, env=env, capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    assert "tabular_mlp" in listed.stdout
    assert "tabular-calib 0.1.0" in listed.stdout
    probe = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        from raysearch.training.registries import registry
        from raysearch.training.models import build_model
        from raysearch.training.data import load_dataset
        data = load_dataset("synthetic_table", n_samples=400, n_features=6)
        model = build_model("tabular_mlp", num_classes=data.num_classes,
                            input_shape=data.input_shape, hidden=5)
        print(data.input_shape, model.head.in_features, registry("losses").source("poly1"),
              registry("calibrators").source("vector_scaling"))
        """)], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=120)
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.split() == ["(6,)", "5", "tabular-calib", "0.1.0", "tabular-calib",
                                    "0.1.0"]


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def test_registry_kinds():
    assert set(ENTRY_POINT_GROUPS) >= {"models", "datasets", "losses", "calibrators"}
    assert "adamw" in registry("optimizers").names()
    with pytest.raises(ValueError, match="unknown kind"):
        registry("gizmos")
