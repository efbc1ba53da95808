"""Importing a Marian (OPUS-MT) model, and its SavedModel against `transformers` and CTranslate2.

Usage:
    python benchmarks/marian_import.py --multi30k-dir ../shared/data/multi30k

No model hub is reachable here, so the model is a random `MarianMTModel` of
OPUS-MT's real shape (6 + 6 layers, d_model 512, 8 heads, feed-forward 2048,
swish, 58,101 pieces: SentencePiece models of 7,000 pieces a side trained on
Multi30k's training text, the rest of the vocabulary filled with pieces
neither side makes), saved in the Hugging Face layout. Measured, in one
process:

1. `kt import marian` of that folder: seconds and peak memory (the target:
   under 2 minutes), and the logits' largest difference from `transformers`'
   on Multi30k sentences (the target: within 1e-4).
2. Translation of `--sentences` Multi30k test sentences, `--batch-size` a
   call, greedy and beam 4, by the imported model's SavedModel (TensorFlow),
   by `MarianMTModel.generate` (PyTorch) and by CTranslate2 (its own converter
   of the same folder), each on `--threads` threads, the engines in turn, the
   median of `--repeats`. A random model never ends a sentence, so every
   engine decodes to one limit, `--max-output-length` pieces a sentence, and
   the benchmark checks on the first batch that the engines' outputs have the
   same lengths (the SavedModel's search run by Keras on the same ids).

Writes benchmarks/results/marian_import.json.
"""

import argparse
import json
import os
import resource
import sys
import tempfile
import time

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))

from benchmarks.common import (  # noqa: E402
    RESULTS,
    add_parallel_arguments,
    median,
    read_parallel,
    table,
    write_result,
)

# Triton's native library crashes a process that holds TensorFlow's (a segfault at import);
# PyTorch runs on the CPU here and does without it.
sys.modules.setdefault("triton", None)

OPUS_MT = {"layers": 6, "d_model": 512, "heads": 8, "ffn": 2048, "vocabulary": 58101}


def build_folder(folder, sources, targets, shape, pieces, seed=0):
    """A random `MarianMTModel` of `shape` with SentencePiece models trained on the text."""
    import sentencepiece as spm
    import torch
    import transformers

    os.makedirs(folder)
    vocabulary = ["</s>", "<unk>"]
    for side, texts in (("source", sources), ("target", targets)):
        prefix = os.path.join(folder, side)
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(texts), model_prefix=prefix, vocab_size=pieces,
            character_coverage=1.0, minloglevel=2,
        )  # fmt: skip
        os.replace(f"{prefix}.model", f"{prefix}.spm")
        processor = spm.SentencePieceProcessor(model_file=f"{prefix}.spm")
        known = set(vocabulary)
        for index in range(processor.get_piece_size()):
            piece = processor.id_to_piece(index)
            if processor.is_control(index) or processor.is_unknown(index) or piece in known:
                continue
            vocabulary.append(piece)
            known.add(piece)
    filler = shape["vocabulary"] - 1 - len(vocabulary)
    vocabulary += [f"\u2581filler{index}" for index in range(filler)] + ["<pad>"]
    with open(os.path.join(folder, "vocab.json"), "w", encoding="utf-8") as handle:
        json.dump({piece: index for index, piece in enumerate(vocabulary)}, handle)
    with open(os.path.join(folder, "tokenizer_config.json"), "w", encoding="utf-8") as handle:
        json.dump({"separate_vocabs": False, "source_lang": "en", "target_lang": "de"}, handle)
    pad = len(vocabulary) - 1
    config = transformers.MarianConfig(
        vocab_size=len(vocabulary), d_model=shape["d_model"],
        encoder_layers=shape["layers"], decoder_layers=shape["layers"],
        encoder_ffn_dim=shape["ffn"], decoder_ffn_dim=shape["ffn"],
        encoder_attention_heads=shape["heads"], decoder_attention_heads=shape["heads"],
        activation_function="swish", scale_embedding=True, max_position_embeddings=512,
        pad_token_id=pad, eos_token_id=0, decoder_start_token_id=pad,
        forced_eos_token_id=None, bad_words_ids=[[pad]],
    )  # fmt: skip
    torch.manual_seed(seed)
    model = transformers.MarianMTModel(config).eval()
    with torch.no_grad():
        model.final_logits_bias.normal_(0.0, 0.5)
    model.save_pretrained(folder)
    return model, transformers.MarianTokenizer.from_pretrained(folder)


def timed_import(folder, run):
    """`(seconds, peak MiB of this process so far)` of `import_marian`."""
    from pipelines.imports.marian import import_marian

    started = time.perf_counter()
    import_marian(folder, run)
    seconds = time.perf_counter() - started
    return seconds, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def logits_difference(ours, model, tokenizer, sources, targets):
    """The largest absolute difference of our logits from `transformers`' (teacher forcing).

    Args:
        ours: the imported `Transformer`.
        model, tokenizer: the `MarianMTModel` and its `MarianTokenizer`.
        sources, targets: lists of str, a batch of pairs (padded; padding positions left out).

    Returns:
        float.
    """
    import numpy as np
    import torch

    batch = tokenizer(sources, text_target=targets, padding=True, return_tensors="pt")
    pad = model.config.pad_token_id
    labels = np.where(batch["labels"].numpy() == -100, pad, batch["labels"].numpy())
    decoder_inputs = np.concatenate([np.full((len(labels), 1), pad), labels[:, :-1]], axis=1)
    with torch.no_grad():
        expected = model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            decoder_input_ids=torch.tensor(decoder_inputs),
        ).logits.numpy()
    logits = np.asarray(ours((batch["input_ids"].numpy(), decoder_inputs)))
    real = labels != pad
    return float(np.max(np.abs(logits[real] - expected[real])))


def engines(run, folder, model, tokenizer, work, threads, limit):
    """`{name: translate(batch, beam) -> (texts, output pieces of each)}` for the three engines.

    Every engine produces at most `limit` target pieces a sentence, the end
    included, whatever the sentence; a random model never ends one, so each
    decodes `limit` steps and the engines do equal work (their outputs'
    lengths are returned to check it).
    """
    import ctranslate2
    import tensorflow as tf
    import torch

    from pipelines.serving.saved_model import Translator, export
    from pipelines.training.checkpoints import load_checkpoint

    torch.set_num_threads(threads)
    keras_model = load_checkpoint(os.path.join(run, "model.keras"))
    translator = Translator(
        keras_model,
        os.path.join(run, "sentencepiece.model"), 512, lengths={"max_output_length": limit},
        signatures=["translate"],
    )  # fmt: skip
    path = export(translator, os.path.join(work, "saved_models", "marian"))
    translate = tf.saved_model.load(path).signatures["translate"]
    ct2_path = os.path.join(work, "ct2")
    ctranslate2.converters.TransformersConverter(folder).convert(ct2_path)
    ct2 = ctranslate2.Translator(ct2_path, device="cpu", intra_threads=threads)

    def ours(batch, beam):
        outputs = translate(inputs=tf.constant(batch), beam_size=tf.constant(beam),
                            alpha=tf.constant(0.0), penalty_form=tf.constant(""))  # fmt: skip
        return [t.decode("utf-8") for t in outputs["translations"].numpy()], None

    def our_lengths(batch, beam):
        """The pieces of each output of the SavedModel's search, run by Keras on the same ids."""
        import numpy as np

        from keras_transformer import beam_search

        ids = tokenizer(batch, return_tensors="np", padding=True)["input_ids"]
        ids = np.where(ids == model.config.pad_token_id, keras_model.pad_id, ids)
        tokens = beam_search(keras_model, ids, beam_size=beam, alpha=0.0, max_output_length=limit)
        return (np.asarray(tokens[0])[:, 0] != keras_model.pad_id).sum(axis=1).tolist()

    def theirs(batch, beam):
        inputs = tokenizer(batch, return_tensors="pt", padding=True)
        with torch.no_grad():
            generated = model.generate(
                **inputs, num_beams=beam, do_sample=False, max_new_tokens=limit,
                length_penalty=0.0, early_stopping=True, forced_eos_token_id=None,
            )  # fmt: skip
        lengths = (generated[:, 1:] != model.config.pad_token_id).sum(axis=1).tolist()
        return tokenizer.batch_decode(generated, skip_special_tokens=True), lengths

    def ctranslate(batch, beam):
        ids = tokenizer(batch)["input_ids"]
        pieces = [tokenizer.convert_ids_to_tokens(row) for row in ids]  # </s> included
        results = ct2.translate_batch(
            pieces, beam_size=beam, length_penalty=0.0, max_decoding_length=limit,
            return_end_token=True,
        )  # fmt: skip
        hypotheses = [r.hypotheses[0] for r in results]
        texts = [tokenizer.convert_tokens_to_string(h) for h in hypotheses]
        return texts, [len(h) for h in hypotheses]

    return {"savedmodel": ours, "transformers": theirs, "ctranslate2": ctranslate}, our_lengths


def output_lengths(calls, our_lengths, batch):
    """Mean output pieces a sentence of each engine and beam on `batch`; an error where they
    differ."""
    means = {}
    for (name, call), beam in ((item, beam) for item in calls.items() for beam in (1, 4)):
        lengths = our_lengths(batch, beam) if name == "savedmodel" else call(batch, beam)[1]
        means[f"{name}_beam{beam}"] = sum(lengths) / len(lengths)
    if max(means.values()) - min(means.values()) > 0.5:
        raise SystemExit(f"the engines decoded unequal lengths (pieces a sentence): {means}")
    return means


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_parallel_arguments(parser, "test_2016_flickr")
    parser.add_argument("--train-sentences", type=int, default=29000, help="for the SentencePieces")
    parser.add_argument("--pieces", type=int, default=7000, help="SentencePiece pieces a side")
    parser.add_argument("--sentences", type=int, default=128, help="test sentences translated")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument(
        "--max-output-length", type=int, default=40, help="target pieces a sentence, every engine"
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--shape", default=json.dumps(OPUS_MT), help="JSON: the model's sizes")
    parser.add_argument("--output", default=os.path.join(RESULTS, "marian_import.json"))
    args = parser.parse_args(argv)
    sources, _ = read_parallel(parser, args, "test_2016_flickr")
    sources = sources[: args.sentences]
    import keras

    from pipelines.data.corpus import load_multi30k

    train = load_multi30k(args.multi30k_dir, "train", "en", "de")[: args.train_sentences]
    shape = json.loads(args.shape)
    with tempfile.TemporaryDirectory() as work:
        folder, run = os.path.join(work, "hf"), os.path.join(work, "run")
        model, tokenizer = build_folder(
            folder, [s for s, _ in train], [t for _, t in train], shape, args.pieces
        )
        import_seconds, peak = timed_import(folder, run)
        ours = keras.saving.load_model(os.path.join(run, "model.keras"))
        difference = logits_difference(ours, model, tokenizer, sources[:16], sources[:16])
        calls, our_lengths = engines(
            run, folder, model, tokenizer, work, args.threads, args.max_output_length
        )
        size = args.batch_size
        batches = [sources[i : i + size] for i in range(0, len(sources), size)]
        lengths = output_lengths(calls, our_lengths, batches[0])
        seconds = {(name, beam): [] for name in calls for beam in (1, 4)}
        for name, beam in seconds:  # trace and warm up
            calls[name](batches[0][:2], beam)
        for repeat in range(args.repeats):
            order = list(seconds) if repeat % 2 == 0 else list(seconds)[::-1]
            for name, beam in order:
                started = time.perf_counter()
                for batch in batches:
                    calls[name](batch, beam)
                seconds[(name, beam)].append(time.perf_counter() - started)
    rates = {f"{name}_beam{beam}": len(sources) / median(v) for (name, beam), v in seconds.items()}
    ratios = {
        f"savedmodel_over_{other}_beam{beam}": rates[f"savedmodel_beam{beam}"]
        / rates[f"{other}_beam{beam}"]
        for other in ("transformers", "ctranslate2")
        for beam in (1, 4)
    }
    result = write_result(
        {
            "benchmark": "marian_import",
            "command": "python benchmarks/marian_import.py " + " ".join(argv or sys.argv[1:]),
            "shape": shape,
            "import_seconds": round(import_seconds, 1),
            "peak_mib_after_import": round(peak),
            "logits_max_difference": difference,
            "sentences": len(sources),
            "batch_size": args.batch_size,
            "threads": args.threads,
            "max_output_length": args.max_output_length,
            "output_pieces_per_sentence": {k: round(v, 2) for k, v in lengths.items()},
            "sentences_per_second": {k: round(v, 2) for k, v in rates.items()},
            "ratios": {k: round(v, 3) for k, v in ratios.items()},
        },
        args.output,
    )
    rows = [[name, f"{value:.2f}"] for name, value in result["sentences_per_second"].items()]
    print(f"import {result['import_seconds']} s, logits within {difference:.2e}")
    print(table(["engine", "sentences/s"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
