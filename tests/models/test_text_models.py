"""GlobalPoolingCNN (MbLS's 20 Newsgroups network), GloVe loading and the registry factory."""

import numpy as np
import pytest
import torch
from torch import nn

from raysearch.training.models.text import GlobalPoolingCNN, build_gpool_cnn, load_glove, min_length

VOCAB = ["the", "space", "graphics", "atheism", "zzunknown"]


def _vector(seed: int, dim: int = 100) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(dim).astype(np.float32)


def _write_glove(path, rows: dict[str, np.ndarray]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for word, vec in rows.items():
            f.write(word + " " + " ".join(repr(float(v)) for v in vec) + "\n")


@pytest.fixture
def glove(tmp_path):
    """A 100d GloVe file: three vocabulary words, two others (one non-ASCII)."""
    rows = {
        "space": _vector(1),
        "apple": _vector(2),
        "the": _vector(3),
        "café": _vector(4),
        "atheism": _vector(5),
    }
    path = tmp_path / "glove.test.100d.txt"
    _write_glove(path, rows)
    return path, rows


def _n_params(model: nn.Module, trainable: bool = False) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable)


# --------------------------------------------------------------------------------------------
# network


@pytest.mark.parametrize("pool_stride", [1, 5])
def test_output_shape(pool_stride):
    torch.manual_seed(0)
    model = GlobalPoolingCNN(50, 20, pool_stride=pool_stride)
    x = torch.randint(0, 51, (2, 1000))
    assert model(x).shape == (2, 20)
    # the global max pool makes it length-agnostic down to the shortest length
    short = torch.randint(0, 51, (3, min_length(pool_stride)))
    assert model(short).shape == (3, 20)


def test_layers_and_parameter_count():
    model = GlobalPoolingCNN(19999, 20)
    convs = [m for m in model.modules() if isinstance(m, nn.Conv1d)]
    pools = [m for m in model.modules() if isinstance(m, nn.MaxPool1d)]
    assert [(c.in_channels, c.out_channels, c.kernel_size) for c in convs] == [
        (100, 128, (5,)),
        (128, 128, (5,)),
        (128, 128, (5,)),
    ]
    # released MbLS code: F.max_pool1d(kernel_size=5, stride=1)
    assert [(p.kernel_size, p.stride) for p in pools] == [(5, 1), (5, 1)]
    assert model.embedding.weight.shape == (20000, 100)
    # embedding 20000*100; convs 100*128*5+128 and 2 x (128*128*5+128); fc 128*128+128, 128*20+20
    expected = 20000 * 100 + (64000 + 128) + 2 * (81920 + 128) + (16384 + 128) + (2560 + 20)
    assert _n_params(model) == expected
    assert min_length(1) == 21
    assert min_length(5) == 149


def test_frozen_embedding_equals_given_rows_and_gets_no_grad():
    torch.manual_seed(0)
    table = torch.randn(6, 100)
    table[0] = 0
    model = GlobalPoolingCNN(5, 3, embeddings=table)
    assert not model.embedding.weight.requires_grad
    assert torch.equal(model.embedding.weight, table)
    loss = model(torch.randint(0, 6, (4, 30))).sum()
    loss.backward()
    assert model.embedding.weight.grad is None
    assert all(p.grad is not None for p in model.features.parameters())
    # the table was copied: changing the caller's tensor does not change the model
    table[1] += 1
    assert not torch.equal(model.embedding.weight, table)
    # not frozen: trainable, row 0 is padding (no gradient)
    free = GlobalPoolingCNN(5, 3, embeddings=table, freeze_embeddings=False)
    free(torch.tensor([[0] * 25 + [1, 2, 3, 4, 5]])).sum().backward()
    assert free.embedding.weight.requires_grad
    assert torch.count_nonzero(free.embedding.weight.grad[0]) == 0
    assert torch.count_nonzero(free.embedding.weight.grad[1:]) > 0


def test_learned_embedding_has_zero_padding_row():
    torch.manual_seed(0)
    model = GlobalPoolingCNN(10, 4)
    assert model.embedding.weight.requires_grad
    assert torch.count_nonzero(model.embedding.weight[0]) == 0


def test_invalid_arguments():
    with pytest.raises(ValueError, match="embeddings.*\\(6, 100\\).*\\(5, 100\\)"):
        GlobalPoolingCNN(5, 3, embeddings=torch.zeros(5, 100))
    with pytest.raises(TypeError, match="embeddings"):
        GlobalPoolingCNN(5, 3, embeddings=torch.zeros(6, 100, dtype=torch.int64))
    with pytest.raises(ValueError, match="num_classes"):
        GlobalPoolingCNN(5, 1)
    with pytest.raises(ValueError, match="vocab_size"):
        GlobalPoolingCNN(0, 3)
    with pytest.raises(ValueError, match="max_len.*>= 21"):
        GlobalPoolingCNN(5, 3, max_len=20)
    with pytest.raises(ValueError, match="max_len.*>= 149"):
        GlobalPoolingCNN(5, 3, max_len=100, pool_stride=5)
    model = GlobalPoolingCNN(5, 3)
    with pytest.raises(ValueError, match=r"\(N, L\) integer tokens.*\(2, 30, 1\)"):
        model(torch.zeros(2, 30, 1, dtype=torch.int64))
    with pytest.raises(ValueError, match="float32"):
        model(torch.zeros(2, 30))


def test_training_a_few_steps_lowers_the_loss():
    # two classes told apart by their words (tokens 1-5 vs 6-10), padded in front like the data
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    n, length = 16, 30
    y = torch.arange(n) % 2
    words = torch.randint(1, 6, (n, 12), generator=gen) + 5 * y[:, None]
    x = torch.cat([torch.zeros(n, length - 12, dtype=torch.int64), words], dim=1)
    model = GlobalPoolingCNN(10, 2, max_len=length)
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()
    with torch.no_grad():
        first = loss_fn(model(x), y).item()
    for _ in range(10):
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
    with torch.no_grad():
        last = loss_fn(model(x), y).item()
        accuracy = (model(x).argmax(1) == y).float().mean().item()
    assert last < 0.5 * first
    assert accuracy == 1.0


# --------------------------------------------------------------------------------------------
# GloVe


def test_load_glove_rows(glove):
    path, rows = glove
    table = load_glove(path, VOCAB, dim=100)
    assert table.dtype == torch.float32
    assert table.shape == (len(VOCAB) + 1, 100)
    assert torch.count_nonzero(table[0]) == 0  # padding
    assert torch.equal(table[1], torch.tensor(rows["the"]))
    assert torch.equal(table[2], torch.tensor(rows["space"]))
    assert torch.count_nonzero(table[3]) == 0  # "graphics": not in the file
    assert torch.equal(table[4], torch.tensor(rows["atheism"]))
    assert torch.count_nonzero(table[5]) == 0
    # a non-ASCII word (utf-8 in the file) is found too
    assert torch.equal(load_glove(path, ["café"])[1], torch.tensor(rows["café"]))


def test_load_glove_malformed_line(tmp_path, glove):
    path, rows = glove
    bad = tmp_path / "bad.txt"
    lines = path.read_text(encoding="utf-8").splitlines()
    lines[2] = " ".join(lines[2].split()[:-1])  # 99 values on line 3
    bad.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match="line 3 is malformed.*100 values, got 99") as err:
        load_glove(bad, VOCAB)
    assert str(bad) in str(err.value)
    assert "\n" not in str(err.value)
    # a value that is not a number, in a vocabulary word's line
    lines = path.read_text(encoding="utf-8").splitlines()
    lines[0] = lines[0].replace(lines[0].split()[5], "x1.0", 1)
    bad.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match="line 1 is malformed") as err:
        load_glove(bad, VOCAB)
    assert "\n" not in str(err.value)
    # wrong dim asked for
    with pytest.raises(ValueError, match="line 1 is malformed.*50 values, got 100"):
        load_glove(path, VOCAB, dim=50)


def test_load_glove_missing_file_and_bad_arguments(tmp_path):
    missing = tmp_path / "nope.txt"
    with pytest.raises(ValueError, match="GloVe file not found") as err:
        load_glove(missing, VOCAB)
    assert str(missing) in str(err.value)
    with pytest.raises(ValueError, match="duplicate"):
        load_glove(missing, ["a", "a"])
    latin = tmp_path / "latin.txt"
    latin.write_bytes(b"caf\xe9 " + b" ".join([b"0.5"] * 100) + b"\n")
    with pytest.raises(ValueError, match="line 1 is not utf-8"):
        load_glove(latin, ["cafe"])


# --------------------------------------------------------------------------------------------
# factory


def test_build_gpool_cnn(glove):
    path, rows = glove
    torch.manual_seed(0)
    model = build_gpool_cnn(num_classes=20, input_shape=(1000,), vocabulary=VOCAB)
    assert model.vocab_size == 5
    assert model.max_len == 1000
    assert model.embedding.weight.requires_grad  # no GloVe: learned
    assert model(torch.randint(0, 6, (2, 1000))).shape == (2, 20)
    glove_model = build_gpool_cnn(
        num_classes=20, input_shape=(1000,), vocabulary=VOCAB, embeddings_path=path
    )
    assert not glove_model.embedding.weight.requires_grad
    assert torch.equal(glove_model.embedding.weight[2], torch.tensor(rows["space"]))
    with pytest.raises(ValueError, match="needs the dataset's `vocabulary`"):
        build_gpool_cnn(num_classes=20, input_shape=(1000,))
    with pytest.raises(ValueError, match=r"input_shape.*\(L,\)"):
        build_gpool_cnn(num_classes=20, input_shape=(1, 8, 8), vocabulary=VOCAB)
