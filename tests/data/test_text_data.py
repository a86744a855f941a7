"""20 Newsgroups loader: both on-disk layouts written in tmp_path, the Keras-style tokenizer.

Nothing is downloaded. The trees are tiny (3 groups of a few messages), so the validation size is
set with `val_fraction` except where the default rule ``min(900, pool // 10)`` is under test.
"""

import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset

from raysearch.training.data import DatasetError, DatasetSplits
from raysearch.training.data.text import (
    KERAS_FILTERS,
    MAX_LEN,
    MAX_WORDS,
    TextDatasetSplits,
    default_val_size,
    fit_vocabulary,
    load_newsgroups20,
    original_split_indices,
    strip_header,
    text_to_words,
    texts_to_tokens,
)

GROUPS = ["alt.atheism", "comp.graphics", "sci.space"]
#: one word per group, twice in each of its messages
GROUP_WORD = {"alt.atheism": "atheism", "comp.graphics": "graphics", "sci.space": "space"}


def _message(sender: str, subject: str, body: str) -> str:
    return f"From: {sender}@mailhost.example.com\nSubject: {subject}\nLines: 3\n\n{body}\n"


def _body(group: str, n: int) -> str:
    # "the" x5, the group word x2, a latin-1 word, then a word unique to the message
    word = GROUP_WORD.get(group, "other")
    return f"The the, THE the the! {word} {word}. Caf\xe9 msg{group[:3]}{n}"


def _write_group(folder, group, ids, *, body=_body):
    path = folder / group
    path.mkdir(parents=True, exist_ok=True)
    for n in ids:
        text = _message("zzsender", "hdrsubjectword", body(group, n))
        (path / str(n)).write_bytes(text.encode("latin-1"))
    return path


@pytest.fixture
def bydate(tmp_path):
    """20news-bydate-train/ (6 messages per group) and 20news-bydate-test/ (2 per group)."""
    for g, group in enumerate(GROUPS):
        _write_group(tmp_path / "20news-bydate-train", group, range(100 * g + 10, 100 * g + 16))
        _write_group(tmp_path / "20news-bydate-test", group, [100 * g + 50, 100 * g + 60])
    # a third test message of sci.space, with a word found in no training message
    (tmp_path / "20news-bydate-test" / "sci.space" / "299").write_bytes(
        _message("zzsender", "s", "space testonlyword the graphics caf\xe9").encode("latin-1")
    )
    # ignored: not all-digit names
    (tmp_path / "20news-bydate-train" / "sci.space" / ".DS_Store").write_text("x")
    (tmp_path / "20news-bydate-train" / "sci.space" / "README").write_text("x")
    return tmp_path


@pytest.fixture
def original(tmp_path):
    """20_newsgroups/<group>/<id>: 10 messages per group (30 in all)."""
    for g, group in enumerate(GROUPS):
        _write_group(tmp_path / "20_newsgroups", group, range(1000 * g + 1, 1000 * g + 11))
    return tmp_path


def _tokens(ds: TensorDataset) -> torch.Tensor:
    return ds.tensors[0]


def _labels(ds: TensorDataset) -> torch.Tensor:
    return ds.tensors[1]


def _one_line(err: pytest.ExceptionInfo) -> str:
    msg = str(err.value)
    assert "\n" not in msg
    return msg


# --------------------------------------------------------------------------------------------
# tokenizer pieces (Keras semantics)


def test_strip_header_like_mbls():
    assert strip_header("From: a\nSubject: b\n\nbody\n\nmore") == "\n\nbody\n\nmore"
    assert strip_header("no blank line\nat all") == "no blank line\nat all"
    # a blank line at position 0 keeps the whole text (`if 0 < i`)
    assert strip_header("\n\nFrom: a\n\nbody") == "\n\nFrom: a\n\nbody"


def test_text_to_words_keras_defaults():
    assert KERAS_FILTERS == '!"#$%&()*+,-./:;<=>?@[\\]^_`{|}~\t\n'
    words = text_to_words("Hello, World!\tfoo-bar it's  e-mail:x@y.COM\n(ok)")
    assert words == ["hello", "world", "foo", "bar", "it's", "e", "mail", "x", "y", "com", "ok"]
    # Keras splits on " " only: a form feed stays inside the word
    assert text_to_words("a\x0cb c") == ["a\x0cb", "c"]


def test_fit_vocabulary_counts_ties_and_num_words():
    # counts: b 1, a 2, c 2, d 3 -> d (3), then a and c tied at 2 (a seen first), then b
    texts = ["b a", "a c c", "d d d"]
    assert fit_vocabulary(texts, num_words=100) == ["d", "a", "c", "b"]
    # Keras keeps indices < num_words: num_words - 1 words
    assert fit_vocabulary(texts, num_words=3) == ["d", "a"]
    assert fit_vocabulary(texts, num_words=1) == []
    with pytest.raises(ValueError, match="num_words"):
        fit_vocabulary(texts, num_words=0)


def test_texts_to_tokens_pre_padding_and_pre_truncation():
    vocab = ["a", "b", "c", "d"]
    out = texts_to_tokens(["a b c d", "zz c", "", "d"], vocab, max_len=3)
    assert out.dtype == np.int64
    # truncating="pre" keeps the LAST 3 words; padding="pre" puts zeros first; unknown dropped
    assert out.tolist() == [[2, 3, 4], [0, 0, 3], [0, 0, 0], [0, 0, 4]]
    with pytest.raises(ValueError, match="max_len"):
        texts_to_tokens(["a"], vocab, max_len=0)


def test_default_val_size_is_900_on_the_real_pools():
    assert default_val_size(15998) == 900  # original tree after its 3,999 test messages
    assert default_val_size(11314) == 900  # bydate train
    assert default_val_size(9000) == 900
    assert default_val_size(5000) == 500
    assert default_val_size(39) == 3


def test_original_split_sizes_match_mbls_app_b():
    # 19,997 messages as in the original tree (997 in the last group): 15,098 / 900 / 3,999
    labels = np.repeat(np.arange(20), 1000)[:19997]
    train, val, test, info = original_split_indices(labels, seed=0)
    assert (len(train), len(val), len(test)) == (15098, 900, 3999)
    assert len(np.unique(np.concatenate([train, val, test]))) == 19997
    # stratified: every group holds its share of test (+-1)
    counts = np.bincount(labels[test], minlength=20)
    assert counts.min() >= 199
    assert counts.max() <= 201
    assert info["test_fraction"] == 0.2
    assert "3999" in info["test_split"]
    assert "900" in info["val_split"]


# --------------------------------------------------------------------------------------------
# bydate layout


def test_bydate_splits_shapes_and_info(bydate):
    splits = load_newsgroups20(seed=0, val_fraction=1 / 3, data_dir=bydate)
    assert isinstance(splits, TextDatasetSplits)
    assert isinstance(splits, DatasetSplits)
    assert splits.name == "newsgroups20"
    assert splits.num_classes == 3
    assert splits.class_names == GROUPS
    assert splits.input_shape == (MAX_LEN,) == (1000,)
    # train: 6 per group; val: a third of them, stratified
    assert (len(splits.train), len(splits.val), len(splits.test)) == (12, 6, 7)
    assert np.bincount(_labels(splits.val).numpy()).tolist() == [2, 2, 2]
    # test is the bydate test tree, in file order
    assert _labels(splits.test).tolist() == [0, 0, 1, 1, 2, 2, 2]
    for ds in (splits.train, splits.val, splits.test):
        assert _tokens(ds).dtype == torch.int64
        assert _tokens(ds).shape[1] == 1000
        assert _labels(ds).dtype == torch.int64
    info = splits.info
    assert info["layout"] == "bydate"
    assert (info["train_size"], info["val_size"], info["test_size"]) == (12, 6, 7)
    assert info["vocab_size"] == len(splits.vocabulary)
    assert info["max_len"] == 1000
    assert info["max_words"] == MAX_WORDS
    assert "bydate train split (18 messages)" in info["val_split"]
    assert info["val_fraction"] == pytest.approx(6 / 18)
    assert all(isinstance(v, (str, int, float)) for v in info.values())


def test_headers_stripped_and_vocabulary_from_train_only(bydate):
    splits = load_newsgroups20(seed=0, val_fraction=1 / 3, data_dir=bydate)
    vocab = splits.vocabulary
    # header-only words never reach the vocabulary
    for word in ("zzsender", "mailhost", "from", "subject", "hdrsubjectword", "lines"):
        assert word not in vocab
    # a word only in the test tree is not in the vocabulary; latin-1 decoded words are
    assert "testonlyword" not in vocab
    assert "café" in vocab
    # ranking over the 12 training messages (4 per group): "the" 60, "café" 12, then the group
    # words, 8 each: a tie, broken by first occurrence (file order: sorted groups)
    assert vocab[:5] == ["the", "café", "atheism", "graphics", "space"]
    assert len(vocab) == 5 + 12  # plus the 12 words unique to a training message


def test_tokens_match_hand_derived_sequence(bydate):
    splits = load_newsgroups20(seed=0, val_fraction=1 / 3, data_dir=bydate)
    vocab = splits.vocabulary
    index = {w: i + 1 for i, w in enumerate(vocab)}
    assert (index["the"], index["café"], index["graphics"], index["space"]) == (1, 2, 4, 5)
    # last test message (sci.space/299): "space testonlyword the graphics café"; the header
    # is gone and "testonlyword" (not in the vocabulary) is dropped; zeros in front
    row = _tokens(splits.test)[-1]
    expected = torch.zeros(1000, dtype=torch.int64)
    expected[-4:] = torch.tensor([5, 1, 4, 2])
    assert torch.equal(row, expected)
    # every token of every split is a vocabulary index
    for ds in (splits.train, splits.val, splits.test):
        assert int(_tokens(ds).max()) <= len(vocab)
        assert int(_tokens(ds).min()) >= 0


def test_vocabulary_ignores_validation_messages(tmp_path):
    # each training-tree message holds one unique word besides "common"
    def body(group, n):
        return f"common uniq{n}"

    for g, group in enumerate(GROUPS):
        _write_group(tmp_path / "20news-bydate-train", group, range(10 * g, 10 * g + 4), body=body)
        _write_group(tmp_path / "20news-bydate-test", group, [500 + g], body=body)
    splits = load_newsgroups20(seed=3, val_fraction=0.25, data_dir=tmp_path)
    assert (len(splits.train), len(splits.val)) == (9, 3)
    # "common" (in all 9 training messages) first, then the 9 unique words of train
    assert splits.vocabulary[0] == "common"
    assert len(splits.vocabulary) == 10
    # validation messages: only "common" is known, their unique words are not in the vocabulary
    for row in _tokens(splits.val).tolist():
        assert [t for t in row if t] == [1]
    for row in _tokens(splits.train).tolist():
        assert len([t for t in row if t]) == 2


def test_val_default_rule_on_small_data(tmp_path):
    # 3 groups x 14 train messages: pool 42 -> min(900, 42 // 10) = 4 validation messages
    for g, group in enumerate(GROUPS):
        _write_group(tmp_path / "20news-bydate-train", group, range(100 * g, 100 * g + 14))
        _write_group(tmp_path / "20news-bydate-test", group, [900 + g])
    splits = load_newsgroups20(seed=0, data_dir=tmp_path)
    assert (len(splits.train), len(splits.val), len(splits.test)) == (38, 4, 3)
    assert "min(900, pool // 10) = 4" in splits.info["val_split"]


def test_val_default_too_small_to_stratify_is_one_line_error(bydate):
    # pool 19 -> 1 validation message for 3 groups: cannot stratify
    with pytest.raises(DatasetError, match="val_fraction") as err:
        load_newsgroups20(seed=0, data_dir=bydate)
    assert "newsgroups20" in _one_line(err)


def test_bydate_under_sklearn_home(bydate):
    home = bydate / "scikit_learn_data" / "20news_home"
    home.mkdir(parents=True)
    for tree in ("20news-bydate-train", "20news-bydate-test"):
        (bydate / tree).rename(home / tree)
    a = load_newsgroups20(seed=0, val_fraction=1 / 3, data_dir=home.parent)
    b = load_newsgroups20(seed=0, val_fraction=1 / 3, data_dir=home)
    assert a.info["layout"] == b.info["layout"] == "bydate"
    assert torch.equal(_tokens(a.train), _tokens(b.train))
    assert a.vocabulary == b.vocabulary


def test_bydate_rejects_test_fraction(bydate):
    with pytest.raises(DatasetError, match="test_fraction") as err:
        load_newsgroups20(seed=0, val_fraction=0.3, test_fraction=0.2, data_dir=bydate)
    _one_line(err)


def test_determinism_by_seed(bydate):
    a = load_newsgroups20(seed=5, val_fraction=1 / 3, data_dir=bydate)
    b = load_newsgroups20(seed=5, val_fraction=1 / 3, data_dir=bydate)
    for x, y in zip((a.train, a.val, a.test), (b.train, b.val, b.test), strict=True):
        assert torch.equal(_tokens(x), _tokens(y))
        assert torch.equal(_labels(x), _labels(y))
    assert a.vocabulary == b.vocabulary
    # another seed moves other messages to val: their unique words leave the vocabulary
    others = [load_newsgroups20(seed=s, val_fraction=1 / 3, data_dir=bydate) for s in (6, 7, 8)]
    assert any(set(o.vocabulary) != set(a.vocabulary) for o in others)


# --------------------------------------------------------------------------------------------
# original layout


def test_original_tree_splits(original):
    splits = load_newsgroups20(seed=0, val_fraction=0.25, data_dir=original)
    # test int(0.2 * 30) = 6 (2 per group), val ceil(0.25 * 24) = 6, train 18
    assert (len(splits.train), len(splits.val), len(splits.test)) == (18, 6, 6)
    assert np.bincount(_labels(splits.test).numpy()).tolist() == [2, 2, 2]
    assert splits.info["layout"] == "original"
    assert splits.info["test_fraction"] == 0.2
    assert splits.class_names == GROUPS
    assert splits.vocabulary[:5] == ["the", "café", "atheism", "graphics", "space"]
    # disjoint splits covering all 30 messages: each message has a unique word
    vocab = ["<pad>", *splits.vocabulary]

    def unique_words(ds):
        return {vocab[t] for row in _tokens(ds).tolist() for t in row if vocab[t].startswith("msg")}

    # val/test messages' unique words are not in the (train-only) vocabulary at all
    assert len(unique_words(splits.train)) == 18
    assert unique_words(splits.val) == unique_words(splits.test) == set()


def test_original_tree_itself_and_test_fraction(original):
    a = load_newsgroups20(seed=1, val_fraction=0.25, data_dir=original)
    b = load_newsgroups20(seed=1, val_fraction=0.25, data_dir=original / "20_newsgroups")
    assert torch.equal(_tokens(a.val), _tokens(b.val))
    assert a.vocabulary == b.vocabulary
    c = load_newsgroups20(seed=1, val_fraction=0.25, test_fraction=0.4, data_dir=original)
    assert len(c.test) == 12
    assert c.info["test_fraction"] == 0.4


def test_imbalance_ratio_long_tails_the_pool(original):
    splits = load_newsgroups20(seed=0, val_fraction=0.25, imbalance_ratio=2, data_dir=original)
    # pool 8 per group -> floor(8 * 0.5 ** (i / 2)) = 8, 5, 4
    assert splits.info["class_counts"] == "8,5,4"
    assert len(splits.train) + len(splits.val) == 17
    assert len(splits.test) == 6


# --------------------------------------------------------------------------------------------
# errors: one line, naming the path and the expected layouts


def test_errors_are_one_line(tmp_path, original):
    with pytest.raises(DatasetError, match="not downloaded") as err:
        load_newsgroups20(seed=0, data_dir=original, download=True)
    assert "20news-bydate-train" in _one_line(err)
    assert "20_newsgroups" in str(err.value)

    with pytest.raises(DatasetError, match="required") as err:
        load_newsgroups20(seed=0)
    _one_line(err)

    missing = tmp_path / "nope"
    with pytest.raises(DatasetError, match="not a folder") as err:
        load_newsgroups20(seed=0, data_dir=missing)
    assert str(missing) in _one_line(err)

    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DatasetError, match="holds no 20 Newsgroups tree") as err:
        load_newsgroups20(seed=0, data_dir=empty)
    assert str(empty) in _one_line(err)
    assert "20news-bydate-test" in str(err.value)


def test_empty_group_is_an_error(original):
    hollow = original / "20_newsgroups" / "talk.politics.misc"
    hollow.mkdir()
    (hollow / "notes.txt").write_text("not a message")
    with pytest.raises(DatasetError, match="holds no message files") as err:
        load_newsgroups20(seed=0, val_fraction=0.25, data_dir=original)
    assert str(hollow) in _one_line(err)


def test_bydate_half_or_mismatched_is_an_error(tmp_path):
    _write_group(tmp_path / "20news-bydate-train", "a.b", [1, 2])
    _write_group(tmp_path / "20news-bydate-train", "c.d", [3, 4])
    with pytest.raises(DatasetError, match="20news-bydate-test is missing") as err:
        load_newsgroups20(seed=0, data_dir=tmp_path)
    _one_line(err)
    _write_group(tmp_path / "20news-bydate-test", "a.b", [5])
    _write_group(tmp_path / "20news-bydate-test", "e.f", [6])
    with pytest.raises(DatasetError, match="different groups") as err:
        load_newsgroups20(seed=0, val_fraction=0.5, data_dir=tmp_path)
    assert "c.d, e.f" in _one_line(err)


def test_single_group_is_an_error(tmp_path):
    _write_group(tmp_path / "20_newsgroups", "only.one", [1, 2, 3])
    with pytest.raises(DatasetError, match="at least 2") as err:
        load_newsgroups20(seed=0, data_dir=tmp_path)
    _one_line(err)


def test_crlf_messages_read_with_universal_newlines(tmp_path):
    # "\r\n\r\n" reads as "\n\n" (text mode, as MbLS's open()): the header is still stripped
    for g, group in enumerate(["a.x", "b.y"]):
        folder = tmp_path / "20_newsgroups" / group
        folder.mkdir(parents=True)
        for n in range(10):
            text = f"From: crlfsender\r\nSubject: s\r\n\r\nbody{g} word\r\nend\r\n"
            (folder / str(n + 1)).write_bytes(text.encode("latin-1"))
    splits = load_newsgroups20(seed=0, val_fraction=0.25, data_dir=tmp_path)
    assert "crlfsender" not in splits.vocabulary
    assert set(splits.vocabulary) == {"body0", "body1", "word", "end"}
