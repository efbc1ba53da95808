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
    # `eos_bias` makes some outputs end before the length limit, and others not.
    "shared-swish": {
        "activation_function": "swish", "heads": 2, "separate": False, "eos_bias": 6.0
    },
    # Separate vocabularies of unequal sizes, and a length penalty of its own.
    "separate-relu": {
        "activation_function": "relu", "heads": 4, "separate": True, "length_penalty": 0.8,
        "eos_bias": 2.5,
    },
}  # fmt: skip
# Their `length_penalty` (transformers' default 1 where they set none).
SHAPES_ALPHA = {name: shape.get("length_penalty", 1.0) for name, shape in SHAPES.items()}
# Target-language codes of the shared model's vocabulary.
CODES = [">>fra<<", ">>deu<<"]
# The random models' `max_length` (generate's, the start token included).
MAX_LENGTH = 24


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


def marian_folder(
    root, activation_function, heads, separate, eos_bias, seed=0, length_penalty=None
):
    """A random `MarianMTModel` saved in the Hugging Face layout with its tokenizer files
    and generation settings (OPUS-MT's, with a short `max_length`)."""
    pairs = generate_pairs(600, seed=seed)
    folder = root / "marian"
    folder.mkdir()
    source = train_spm(root / "source", [s for s, _ in pairs], 150)
    target = train_spm(root / "target", [t for _, t in pairs], 190) if separate else source
    (folder / "source.spm").write_bytes((root / "source.model").read_bytes())
    target_file = root / ("target.model" if separate else "source.model")
    (folder / "target.spm").write_bytes(target_file.read_bytes())
    vocabulary = marian_vocabulary(source) if separate else marian_vocabulary(source, target)
    if not separate:  # a multilingual model's target-language codes, one piece each
        pad_piece = vocabulary.popitem()[0]
        vocabulary.update({code: len(vocabulary) + i for i, code in enumerate(CODES)})
        vocabulary[pad_piece] = len(vocabulary)
    target_vocabulary = marian_vocabulary(target) if separate else vocabulary
    pad = len(vocabulary) - 1
    if separate:  # one padding id serves both sides: the larger target's <pad> sits at it
        pieces = [piece for piece in target_vocabulary if piece != "<pad>"]
        pieces.insert(pad, "<pad>")
        target_vocabulary = {piece: index for index, piece in enumerate(pieces)}
    (folder / "vocab.json").write_text(json.dumps(vocabulary))
    if separate:
        (folder / "target_vocab.json").write_text(json.dumps(target_vocabulary))
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"separate_vocabs": separate, "source_lang": "en", "target_lang": "de"})
    )
    config = transformers.MarianConfig(
        vocab_size=len(vocabulary),
        decoder_vocab_size=len(target_vocabulary),
        share_encoder_decoder_embeddings=not separate,
        d_model=32, encoder_layers=2, decoder_layers=2, encoder_ffn_dim=64, decoder_ffn_dim=64,
        encoder_attention_heads=heads, decoder_attention_heads=heads,
        activation_function=activation_function, scale_embedding=True,
        max_position_embeddings=256, pad_token_id=pad, eos_token_id=0,
        decoder_start_token_id=pad, forced_eos_token_id=None, bad_words_ids=[[pad]],
        init_std=0.3,  # outputs that depend on the source
    )  # fmt: skip
    assert (len(target_vocabulary) > len(vocabulary)) == separate
    torch.manual_seed(seed)
    model = transformers.MarianMTModel(config).eval()
    with torch.no_grad():  # a bias that matters, as a trained model's does
        model.final_logits_bias.normal_(0.0, 0.5)
        model.final_logits_bias[0, 0] = eos_bias
    model.save_pretrained(folder)
    generation = {"num_beams": 4, "max_length": MAX_LENGTH, "bad_words_ids": [[pad]],
                  "forced_eos_token_id": 0, "decoder_start_token_id": pad, "pad_token_id": pad,
                  "eos_token_id": 0}  # fmt: skip
    if length_penalty is not None:
        generation["length_penalty"] = length_penalty
    (folder / "generation_config.json").write_text(json.dumps(generation))
    model = transformers.MarianMTModel.from_pretrained(
        folder
    ).eval()  # with its generation settings
    return folder, model, transformers.MarianTokenizer.from_pretrained(folder)


@pytest.fixture(scope="module", params=list(SHAPES))
def imported(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param)
    folder, model, tokenizer = marian_folder(root, **SHAPES[request.param])
    run = root / "run"
    assert import_model.main(["marian", str(folder), "--output-dir", str(run)]) == 0
    ours = keras.saving.load_model(run / "model.keras")
    return {"folder": folder, "model": model, "tokenizer": tokenizer, "run": run, "ours": ours,
            "separate": SHAPES[request.param]["separate"], "shape": request.param}  # fmt: skip


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
                torch.tensor([ids]),
                num_beams=1,
                do_sample=False,
                max_new_tokens=len(tokens),
                forced_eos_token_id=None,  # the search itself, cut where ours stopped
            )[0].tolist()
        assert generated[0] == ours.bos_id == model.config.pad_token_id
        assert generated[1:] == tokens


def generated(imported, sentences, num_beams):
    """`generate`'s texts with the folder's generation settings, and how many hit the limit."""
    tokenizer, model = imported["tokenizer"], imported["model"]
    with torch.no_grad():
        batch = tokenizer(sentences, return_tensors="pt", padding=True)
        tokens = model.generate(**batch, num_beams=num_beams, do_sample=False)
    texts = tokenizer.batch_decode(
        tokens, skip_special_tokens=True, clean_up_tokenization_spaces=False
    )
    lengths = (tokens != model.config.pad_token_id).sum(axis=1)  # the end included
    # MarianTokenizer strips the decoded text's ends (a lone word mark at an end).
    return [text.strip() for text in texts], int((lengths == MAX_LENGTH - 1).sum())


def agreement(ours, theirs):
    return sum(a.strip() == b for a, b in zip(ours, theirs, strict=True)) / len(theirs)


# 64 sentences of the generated corpus the models' vocabularies were not built on.
HELD_OUT = [source for source, _ in generate_pairs(64, seed=11)]


def test_the_export_decodes_with_the_models_generation_settings_as_generate(
    imported, tmp_path, capsys
):
    run = imported["run"]
    decoding = json.loads((run / "config.json").read_text())["decoding"]
    alpha = SHAPES_ALPHA[imported["shape"]]
    assert decoding["beam_size"] == 4 and decoding["alpha"] == alpha
    assert decoding["penalty_form"] == "power" and decoding["end_at_limit"] is True
    assert decoding["max_output_length"] == MAX_LENGTH - 1  # generate's counts the start token
    argv = ["--run-dir", str(run), "--base", str(tmp_path), "--name", "m"]
    assert export.main([*argv, "--signatures", "translate", "serving_default"]) == 0
    capsys.readouterr()
    loaded = tf.saved_model.load(str(tmp_path / "m" / "1"))
    assert set(loaded.signatures) == {"serving_default", "translate"}
    inputs = tf.constant(HELD_OUT)
    beam = loaded.signatures["serving_default"](inputs=inputs)["translations"].numpy()
    greedy = loaded.signatures["translate"](
        inputs=inputs, beam_size=tf.constant(1), alpha=tf.constant(alpha, tf.float32),
        penalty_form=tf.constant(""),
    )["translations"].numpy()  # fmt: skip
    for num_beams, ours in ((1, greedy), (4, beam)):
        theirs, at_limit = generated(imported, HELD_OUT, num_beams)
        # Both ways of ending are checked: at the end token, and forced at the limit.
        assert 0 < at_limit < len(HELD_OUT)
        texts = [text.decode("utf-8") for text in ours]
        assert agreement(texts, theirs) >= 0.98, (num_beams, agreement(texts, theirs))


def test_language_codes_are_kept_whole_as_marian_tokenizer_keeps_them(imported, tmp_path, capsys):
    if imported["separate"]:
        pytest.skip("the codes are in the shared model's vocabulary")
    from pipelines.serving.ctranslate2 import CTranslate2Translator

    tokenizer, run = imported["tokenizer"], imported["run"]
    coded = [f"{code} {text}" for code in CODES for text in HELD_OUT[:16]]
    coded += [">>xyz<< unknown code", "no >>fra<< code at the start"]
    expected = [tokenizer.convert_ids_to_tokens(ids[:-1]) for ids in tokenizer(coded).input_ids]
    assert expected[0][0] == CODES[0] and expected[16][0] == CODES[1]
    argv = ["--run-dir", str(run), "--base", str(tmp_path), "--name", "m"]
    assert export.main([*argv, "--signatures", "align"]) == 0
    assert ctranslate2_export.main(["--run-dir", str(run), "--output", str(tmp_path / "ct2")]) == 0
    capsys.readouterr()
    loaded = tf.saved_model.load(str(tmp_path / "m" / "1"))
    aligned = loaded.signatures["align"](
        inputs=tf.constant(coded), prefixes=tf.constant([""] * len(coded))
    )
    pieces = [[p.decode() for p in row if p] for row in aligned["source_pieces"].numpy()]
    assert pieces == expected
    # CTranslate2 takes pieces as text, and reads those its vocabulary lacks as <unk>.
    known = tokenizer.get_vocab()
    ct2 = CTranslate2Translator(str(tmp_path / "ct2"))
    ct2_pieces = ct2.source_pieces(coded)
    assert [[p if p in known else "<unk>" for p in row] for row in ct2_pieces] == expected
    # The same for target prefixes, whose vocabulary here is the source's.
    ct2_prefixes = ct2.target_pieces(coded)
    assert [[p if p in known else "<unk>" for p in row] for row in ct2_prefixes] == expected
    texts = [t.decode() for t in aligned["translations"].numpy()]
    theirs, _ = generated(imported, coded, 4)
    assert agreement(texts, theirs) >= 0.98
    scores = aligned["scores"].numpy()
    assert np.abs(scores[:16] - scores[16:32]).min() > 1e-4  # the code reaches the model


def test_the_ctranslate2_export_decodes_as_generate(imported, tmp_path, capsys):
    pytest.importorskip("ctranslate2")
    from pipelines.serving.ctranslate2 import CTranslate2Translator

    out = tmp_path / "ct2"
    assert ctranslate2_export.main(["--run-dir", str(imported["run"]), "--output", str(out)]) == 0
    capsys.readouterr()
    translator = CTranslate2Translator(str(out))
    # Beam search stops by CTranslate2's rule (once 4 hypotheses have ended), not generate's,
    # and has no forced end at the limit: 63 of the 64 best hypotheses agree for each model.
    for num_beams, least in ((1, 0.98), (4, 0.9)):
        texts = translator.translate(HELD_OUT, beam_size=num_beams)[0]
        theirs, _ = generated(imported, HELD_OUT, num_beams)
        assert agreement(texts, theirs) >= least, (num_beams, agreement(texts, theirs))


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
    # The batch a fine-tuning run keeps unless given (this one gave 512): not the default 1,024.
    assert json.loads((run / "config.json").read_text())["batching"]["batch_tokens"] == 4096


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
        ("generation_config.json", b'{"num_beams": null}', "num_beams is null, not a whole"),
        ("generation_config.json", b'{"max_length": 1}', "max_length is 1, not a whole number"),
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
