"""`kt import marian`: small random `MarianMTModel`s against `transformers`, the reference."""

import json
import sys

import keras
import numpy as np
import pytest
import sentencepiece as spm
import tensorflow as tf

from benchmarks.marian_import import logits_difference
from keras_transformer import greedy_search
from pipelines.commands import ctranslate2_export, export, import_model, train
from pipelines.data.default_corpus import generate_pairs

# Triton's native library crashes a process that holds TensorFlow's (a segfault at import);
# PyTorch runs on the CPU here and does without it.
sys.modules.setdefault("triton", None)
transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

SENTENCES = ["Monday, March 3, 2014", "4:08 PM", "12.5%", "1,234.5 kilometers per hour"]
SHAPES = {
    "shared-swish": {"activation_function": "swish", "heads": 2, "separate": False},
    "separate-relu": {"activation_function": "relu", "heads": 4, "separate": True},
}


def train_spm(path, sentences, size):
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences), model_prefix=str(path), vocab_size=size,
        character_coverage=1.0, minloglevel=2,
    )  # fmt: skip
    return spm.SentencePieceProcessor(model_file=f"{path}.model")


def marian_vocabulary(*processors):
    """Marian's layout: </s> 0, <unk> 1, the pieces of the SentencePiece models, <pad> last."""
    pieces = ["</s>", "<unk>"]
    for processor in processors:
        for index in range(processor.get_piece_size()):
            piece = processor.id_to_piece(index)
            if not processor.is_control(index) and not processor.is_unknown(index):
                if piece not in pieces:
                    pieces.append(piece)
    return {piece: index for index, piece in enumerate([*pieces, "<pad>"])}


def marian_folder(root, activation_function, heads, separate, seed=0):
    """A random `MarianMTModel` saved in the Hugging Face layout with its tokenizer files."""
    pairs = generate_pairs(600, seed=seed)
    folder = root / "marian"
    folder.mkdir()
    source = train_spm(root / "source", [s for s, _ in pairs], 150)
    target = train_spm(root / "target", [t for _, t in pairs], 150) if separate else source
    (folder / "source.spm").write_bytes((root / "source.model").read_bytes())
    target_file = root / ("target.model" if separate else "source.model")
    (folder / "target.spm").write_bytes(target_file.read_bytes())
    vocabulary = marian_vocabulary(source) if separate else marian_vocabulary(source, target)
    target_vocabulary = marian_vocabulary(target) if separate else vocabulary
    (folder / "vocab.json").write_text(json.dumps(vocabulary))
    if separate:
        (folder / "target_vocab.json").write_text(json.dumps(target_vocabulary))
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"separate_vocabs": separate, "source_lang": "en", "target_lang": "de"})
    )
    pad = len(vocabulary) - 1
    config = transformers.MarianConfig(
        vocab_size=len(vocabulary),
        decoder_vocab_size=len(target_vocabulary),
        share_encoder_decoder_embeddings=not separate,
        d_model=32, encoder_layers=2, decoder_layers=2, encoder_ffn_dim=64, decoder_ffn_dim=64,
        encoder_attention_heads=heads, decoder_attention_heads=heads,
        activation_function=activation_function, scale_embedding=True,
        max_position_embeddings=256, pad_token_id=pad, eos_token_id=0,
        decoder_start_token_id=pad, forced_eos_token_id=None, bad_words_ids=[[pad]],
    )  # fmt: skip
    # One padding id serves both sides: equal sizes put both vocabularies' <pad> last.
    assert len(target_vocabulary) == len(vocabulary)
    torch.manual_seed(seed)
    model = transformers.MarianMTModel(config).eval()
    with torch.no_grad():  # a bias that matters, as a trained model's does
        model.final_logits_bias.normal_(0.0, 0.5)
    model.save_pretrained(folder)
    return folder, model, transformers.MarianTokenizer.from_pretrained(folder)


@pytest.fixture(scope="module", params=list(SHAPES))
def imported(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param)
    folder, model, tokenizer = marian_folder(root, **SHAPES[request.param])
    run = root / "run"
    assert import_model.main(["marian", str(folder), "--output-dir", str(run)]) == 0
    ours = keras.saving.load_model(run / "model.keras")
    return {"folder": folder, "model": model, "tokenizer": tokenizer, "run": run, "ours": ours,
            "separate": SHAPES[request.param]["separate"]}  # fmt: skip


def our_source_ids(run, sentences):
    processor = spm.SentencePieceProcessor(model_file=str(run / "sentencepiece.model"))
    return [processor.encode(sentence) + [0] for sentence in sentences]  # Marian's </s> is 0


def test_the_tokenizers_give_marians_ids(imported):
    expected = imported["tokenizer"](SENTENCES)["input_ids"]
    assert our_source_ids(imported["run"], SENTENCES) == expected
    target_file = imported["run"] / "sentencepiece.target.model"
    target = spm.SentencePieceProcessor(model_file=str(target_file))
    references = ["Montag, 3. März 2014", "16:08", "12,5 %"]
    labels = imported["tokenizer"](text_target=references)["input_ids"]
    assert [target.encode(text) + [0] for text in references] == labels


def test_logits_equal_transformers(imported):
    tokenizer, model, ours = imported["tokenizer"], imported["model"], imported["ours"]
    difference = logits_difference(ours, model, tokenizer, SENTENCES, SENTENCES[::-1])
    assert difference < 1e-4
    # A check that could fail: another model's logits are far from these.
    other = keras.saving.load_model(imported["run"] / "model.keras")
    other.logits_bias.assign(other.logits_bias.numpy() + 1.0)
    assert logits_difference(other, model, tokenizer, SENTENCES, SENTENCES[::-1]) > 0.5


def test_greedy_search_equals_generate(imported):
    model, ours = imported["model"], imported["ours"]
    for ids in our_source_ids(imported["run"], SENTENCES):
        tokens = np.asarray(greedy_search(ours, np.array([ids], "int32"), extra_length=20))[0]
        tokens = list(tokens[tokens != ours.pad_id])
        with torch.no_grad():
            generated = model.generate(
                torch.tensor([ids]), num_beams=1, do_sample=False, max_new_tokens=len(tokens)
            )[0].tolist()
        assert generated[0] == ours.bos_id == model.config.pad_token_id
        assert generated[1:] == tokens


def test_the_saved_model_translates_as_transformers_does(imported, tmp_path, capsys):
    run, model, tokenizer = imported["run"], imported["model"], imported["tokenizer"]
    argv = ["--run-dir", str(run), "--base", str(tmp_path), "--name", "m", "--beam-size", "1"]
    assert export.main(argv) == 0
    capsys.readouterr()
    loaded = tf.saved_model.load(str(tmp_path / "m" / "1"))
    translations = loaded.signatures["serving_default"](inputs=tf.constant(SENTENCES))
    texts = [t.decode("utf-8") for t in translations["translations"].numpy()]
    ours = imported["ours"]
    extra_length = json.loads((run / "config.json").read_text())["decoding"]["extra_length"]
    for sentence, ids, text in zip(SENTENCES, our_source_ids(run, SENTENCES), texts, strict=True):
        limit = len(ids) + extra_length  # the export's output limit
        with torch.no_grad():
            generated = model.generate(
                **tokenizer([sentence], return_tensors="pt"), num_beams=1, do_sample=False,
                max_new_tokens=limit,
            )  # fmt: skip
        expected = tokenizer.batch_decode(
            generated, skip_special_tokens=True, clean_up_tokenization_spaces=False
        )[0]
        # MarianTokenizer strips the decoded text's ends (a lone word mark at an end).
        assert text.strip() == expected, (sentence, generated.tolist())
    assert ours.bos_id == ours.pad_id
    assets = {p.name for p in (tmp_path / "m" / "1" / "assets").iterdir()}
    assert {"sentencepiece.model", "sentencepiece.target.model"} <= assets


def test_ctranslate2_export_equals_ctranslate2s_own_converter(imported, tmp_path, capsys):
    ctranslate2 = pytest.importorskip("ctranslate2")
    if imported["separate"]:
        pytest.skip("CTranslate2's converter registers the source vocabulary for both sides")
    run = imported["run"]
    assert ctranslate2_export.main(["--run-dir", str(run), "--output", str(tmp_path / "ours")]) == 0
    capsys.readouterr()
    converter = ctranslate2.converters.TransformersConverter(str(imported["folder"]))
    converter.convert(str(tmp_path / "theirs"))
    ids = our_source_ids(run, SENTENCES)
    convert = imported["tokenizer"].convert_ids_to_tokens
    # Ours appends </s> itself (`add_source_eos`); CTranslate2's Marian models take it given.
    inputs = {"ours": [convert(row[:-1]) for row in ids], "theirs": [convert(row) for row in ids]}
    options = {"beam_size": 1, "max_decoding_length": 30, "return_scores": True}
    results = [
        ctranslate2.Translator(str(tmp_path / name)).translate_batch(inputs[name], **options)
        for name in ("ours", "theirs")
    ]
    for our, their in zip(*results, strict=True):
        assert our.hypotheses == their.hypotheses
        np.testing.assert_allclose(our.scores, their.scores, atol=1e-3)


def test_an_imported_model_fine_tunes_from_its_weights_and_vocabularies(imported, tmp_path):
    run, out = imported["run"], tmp_path / "tuned"
    flags = ["--init-from", str(run), "--output-dir", str(out), "--steps", "3"]
    flags += ["--set", "default_corpus_sizes=[300,20,20]", "--batch-tokens", "512"]
    assert train.main(flags) == 0
    for name in ("sentencepiece.model", "sentencepiece.target.model"):
        assert (out / name).read_bytes() == (run / name).read_bytes()
    result = json.loads((out / "result.json").read_text())
    assert result["steps"] == 3 and 0.0 <= result["greedy_bleu"] <= 100.0
    tuned = keras.saving.load_model(out / "model.keras")
    assert tuned.get_config()["sinusoid_layout"] == "concatenated"
    assert (tuned.pad_id, tuned.bos_id, tuned.eos_id) == (imported["ours"].pad_id,) * 2 + (0,)
    # The training data was written with the imported model's ids: its </s> ends the sources.
    manifest = json.loads((out / "data" / "train" / "manifest.json").read_text())
    assert manifest["special_ids"] == {"pad_id": tuned.pad_id, "bos_id": tuned.pad_id, "eos_id": 0}
    # The source's length limit, not the default 128.
    recorded = json.loads((out / "config.json").read_text())["batching"]["max_length"]
    assert recorded == imported["model"].config.max_position_embeddings == 256


def write_config(folder, **changes):
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **changes}))


def test_what_cannot_be_imported_is_refused_with_one_line(imported, tmp_path, capsys):
    folder = tmp_path / "copy"
    folder.mkdir()
    for item in imported["folder"].iterdir():
        (folder / item.name).write_bytes(item.read_bytes())

    def refused(*changes):
        for name, value in changes:
            write_config(folder, **{name: value})
        status = import_model.main(["marian", str(folder), "--output-dir", str(tmp_path / "r")])
        err = capsys.readouterr().err
        assert status == 2 and err.startswith("error: ") and err.count("\n") == 1, err
        return err

    err = refused(("decoder_layers", 3))
    assert "encoder_layers=2 and decoder_layers=3 differ" in err
    err = refused(("decoder_layers", 2), ("activation_function", "gelu_new"))
    assert "activation_function='gelu_new'" in err
    err = refused(("activation_function", "swish"), ("model_type", "bart"))
    assert "not a Marian model" in err
    write_config(folder, model_type="marian")
    (folder / "vocab.json").unlink()
    assert "no vocab.json" in refused()
    missing = tmp_path / "nowhere"
    assert "neither a model folder" in import_model_error(missing, tmp_path, capsys)
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize(
    "name, data, message",
    [
        ("config.json", b'{"model_type": "marian",', "config.json: not a readable JSON file"),
        ("config.json", b"[1, 2]", "config.json: holds a JSON list, not an object"),
        ("config.json", b'{"model_type": "marian", "d_model": "512"}', 'd_model is "512"'),
        ("config.json", b'{"model_type": "marian", "encoder_layers": 0}', "encoder_layers is 0,"),
        ("vocab.json", b"{}", "vocab.json: an empty vocabulary"),
        ("vocab.json", b"\xff\xfe{}", "vocab.json: not a readable JSON file"),
        ("vocab.json", b'{"<unk>": "one"}', "vocab.json: not a vocabulary of pieces to ids"),
        ("source.spm", b"not a model at all", "source.spm: not a SentencePiece model"),
        ("model.safetensors", b"\x00" * 64, "model.safetensors: not a readable safetensors"),
        ("config.json", None, "fc1.weight has shape (64, 32),"),  # not the weights' sizes
    ],
)
def test_a_malformed_model_folder_is_refused_naming_the_file_before_anything_is_written(
    imported, tmp_path, capsys, name, data, message
):
    folder = tmp_path / "copy"
    folder.mkdir()
    for item in imported["folder"].iterdir():
        (folder / item.name).write_bytes(item.read_bytes())
    if data is None:  # sizes the stored weights do not have
        write_config(folder, encoder_ffn_dim=48, decoder_ffn_dim=48)
    else:
        (folder / name).write_bytes(data)
    out = tmp_path / "r"
    status = import_model.main(["marian", str(folder), "--output-dir", str(out)])
    err = capsys.readouterr().err
    assert status == 2 and err.startswith("error: ") and err.count("\n") == 1, err
    assert message in err and "Traceback" not in err
    assert not out.exists() and [p.name for p in tmp_path.iterdir()] == ["copy"]


def import_model_error(source, tmp_path, capsys):
    assert import_model.main(["marian", str(source), "--output-dir", str(tmp_path / "r")]) == 2
    return capsys.readouterr().err
