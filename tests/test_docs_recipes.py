"""Every YAML block of docs/recipes.md loads: recipe files as recipes, spaces as spaces, and each
space's fixed training keys reach their config fields (on the recipe the page names)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from raysearch.tune.recipes import apply_recipe, available_recipes, load_recipe
from raysearch.tune.spaces import load_space

DOC = Path(__file__).resolve().parents[1] / "docs" / "recipes.md"
TEXT = DOC.read_text()
BLOCKS = re.findall(r"```yaml\n(.*?)```", TEXT, flags=re.S)
SPACES = [b for b in BLOCKS if "method" in yaml.safe_load(b)]
RECIPES = [b for b in BLOCKS if "source" in yaml.safe_load(b)]


def test_the_page_has_its_blocks_and_names_every_bundled_recipe():
    assert (len(SPACES), len(RECIPES)) == (2, 1)
    for name in available_recipes():
        assert f"`{name}`" in TEXT, name


@pytest.mark.parametrize("block", RECIPES, ids=lambda b: yaml.safe_load(b)["description"])
def test_recipe_block_is_a_valid_recipe(block, tmp_path):
    path = tmp_path / "recipe.yaml"
    path.write_text(block)
    doc = yaml.safe_load(block)
    assert load_recipe(path).values() == {**doc["train"], "val_fraction": doc["val_fraction"]}


@pytest.mark.parametrize(("block", "recipe"),
                         list(zip(SPACES, ["mbls-cifar10", "als-imagenet"], strict=True)),
                         ids=["mbls-cifar10", "als-imagenet"])
def test_space_block_is_a_valid_space_on_its_recipe(block, recipe, tmp_path):
    path = tmp_path / "space.yaml"
    path.write_text(block)
    space = apply_recipe(load_space(path), load_recipe(recipe))
    doc = yaml.safe_load(block)
    sampled = {k: v["low"] if "low" in v else v["choices"][0]
               for k, v in {**doc.get("params", {}), **doc.get("train", {})}.items()
               if isinstance(v, dict)}
    config = space.resolve({"method": doc["method"], **sampled})
    for key, value in sampled.items():  # each searched key reaches its config field
        got = config.loss.params.get(key) if key in doc.get("params", {}) else (
            config.optimizer.lr if key == "lr" else getattr(config, key))
        assert got == value, key
    recipe_epochs = load_recipe(recipe).values()["epochs"]
    assert config.epochs == recipe_epochs
