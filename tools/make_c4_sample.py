#!/usr/bin/python3
"""Rebuilds data/c4_sample/: a small C4-format corpus and a tokenizer trained on its train split.

The text is the npm package nlp-corpus (MIT licence): builds/doc-0.json ... doc-99.json, each a
JSON array of 1,000 English sentences from web pages, reviews, news and reports. Consecutive
sentences come from different sources, so documents are formed by grouping runs of 5-30
consecutive sentences (lengths drawn from a seeded generator), split into paragraphs of 1-5
sentences joined by newlines as in C4's text: the text is real English, the document and
paragraph boundaries are synthetic. Train uses doc-0 ... doc-59, validation doc-60 ... doc-64, so
the splits share no sentence file.

Output, named and shaped like C4 `en` (JSON lines with "text", "timestamp", "url", gzipped):
  data/c4_sample/c4-train.00000-of-00001.json.gz
  data/c4_sample/c4-validation.00000-of-00001.json.gz
  data/c4_sample/tokenizer.model   LLaMA-style SentencePiece BPE (byte fallback, split digits,
                                   identity normalization, unk 0 bos 1 eos 2), --vocab-size

Timestamps and URLs are synthetic and say so: https://example.invalid/nlp-corpus/doc-17#s3 is the
document starting at sentence 3 of doc-17.json. Only the Python standard library is used; the
package comes from `npm pack` unless --tarball names a downloaded one.

usage: tools/make_c4_sample.py [--tarball nlp-corpus-4.4.0.tgz] [--out data/c4_sample]
                               [--vocab-size 4096] [--grass build/grass]
"""
import argparse
import datetime
import gzip
import json
import os
import random
import subprocess
import sys
import tarfile
import tempfile

PACKAGE = "nlp-corpus"
TRAIN_FILES = range(0, 60)
VALIDATION_FILES = range(60, 65)
SEED = 20240601
MIN_SENTENCES, MAX_SENTENCES = 5, 30
MAX_PARAGRAPH_SENTENCES = 5


def fetch_tarball(workdir):
    result = subprocess.run(["npm", "pack", PACKAGE, "--silent"], cwd=workdir, check=True,
                            capture_output=True, text=True)
    return os.path.join(workdir, result.stdout.strip().splitlines()[-1])


def read_sentence_files(tarball, indices):
    """{index: [sentence, ...]} for builds/doc-<index>.json of the package tarball."""
    files = {}
    with tarfile.open(tarball, "r:gz") as tar:
        for index in indices:
            member = tar.extractfile(f"package/builds/doc-{index}.json")
            files[index] = json.load(member)
    return files


def make_documents(sentence_files, rng):
    """C4-style records (runs of MIN..MAX consecutive sentences of one file), and the number of
    sentences they hold."""
    base_time = datetime.datetime(2019, 4, 18, tzinfo=datetime.timezone.utc)
    documents = []
    sentence_count = 0
    for index, sentences in sentence_files.items():
        start = 0
        while start < len(sentences):
            count = rng.randint(MIN_SENTENCES, MAX_SENTENCES)
            chosen = [s.strip() for s in sentences[start:start + count] if s.strip()]
            sentence_count += len(chosen)
            paragraphs = []
            while chosen:
                take = rng.randint(1, MAX_PARAGRAPH_SENTENCES)
                paragraphs.append(" ".join(chosen[:take]))
                chosen = chosen[take:]
            text = "\n".join(paragraphs)
            if text:
                when = base_time + datetime.timedelta(seconds=rng.randrange(30 * 24 * 3600))
                documents.append({
                    "text": text,
                    "timestamp": when.strftime("%Y-%m-%dT%H:%M:%SZ"),
                    "url": f"https://example.invalid/{PACKAGE}/doc-{index}#s{start}",
                })
            start += count
    return documents, sentence_count


def write_c4(path, documents):
    # mtime 0 and no file name in the gzip header: the same input gives the same bytes.
    with open(path, "wb") as raw:
        with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as gz:
            for doc in documents:
                gz.write((json.dumps(doc, ensure_ascii=False) + "\n").encode("utf-8"))


def train_tokenizer(train_path, documents, out_dir, vocab_size, grass):
    """Returns which trainer made tokenizer.model."""
    model_path = os.path.join(out_dir, "tokenizer.model")
    if grass and os.access(grass, os.X_OK):
        probe = subprocess.run([grass, "tokenizer", "train", "--help"], capture_output=True)
        if probe.returncode == 0:
            subprocess.run([grass, "tokenizer", "train", "--input", train_path, "--vocab-size",
                            str(vocab_size), "--out", model_path], check=True)
            return f"{grass} tokenizer train"
    # Debian's spm_train with the settings grass tokenizer train uses, on the documents' lines
    # (paragraphs), as grass tokenizer train reads them.
    with tempfile.TemporaryDirectory() as tmp:
        text_path = os.path.join(tmp, "train.txt")
        with open(text_path, "w", encoding="utf-8") as f:
            for doc in documents:
                f.write(doc["text"] + "\n")  # its paragraphs, one a line
        prefix = os.path.join(tmp, "tokenizer")
        subprocess.run(["spm_train", f"--input={text_path}", f"--model_prefix={prefix}",
                        f"--vocab_size={vocab_size}", "--model_type=bpe", "--byte_fallback=true",
                        "--split_digits=true", "--normalization_rule_name=identity",
                        "--unk_id=0", "--bos_id=1", "--eos_id=2", "--pad_id=-1",
                        "--add_dummy_prefix=true", "--remove_extra_whitespaces=false",
                        "--allow_whitespace_only_pieces=true", "--character_coverage=0.99995",
                        "--num_threads=2", "--minloglevel=2"], check=True)
        os.replace(prefix + ".model", model_path)
    return "spm_train"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tarball", help="nlp-corpus .tgz (default: npm pack nlp-corpus)")
    parser.add_argument("--out", default="data/c4_sample")
    parser.add_argument("--vocab-size", type=int, default=4096)
    parser.add_argument("--grass", default="build/grass",
                        help="use its `tokenizer train` when it has one, else spm_train")
    args = parser.parse_args()

    os.makedirs(args.out, exist_ok=True)
    with tempfile.TemporaryDirectory() as workdir:
        tarball = args.tarball or fetch_tarball(workdir)
        rng = random.Random(SEED)
        splits, sentence_counts = {}, {}
        for split, indices in (("train", TRAIN_FILES), ("validation", VALIDATION_FILES)):
            splits[split], sentence_counts[split] = make_documents(
                read_sentence_files(tarball, indices), rng)
    paths = {}
    for split, documents in splits.items():
        paths[split] = os.path.join(args.out, f"c4-{split}.00000-of-00001.json.gz")
        write_c4(paths[split], documents)
        print(f"{paths[split]}: {len(documents)} documents, {sentence_counts[split]} sentences, "
              f"{sum(len(d['text'].encode()) for d in documents)} bytes of text, "
              f"{os.path.getsize(paths[split])} bytes gzipped", file=sys.stderr)
    trainer = train_tokenizer(paths["train"], splits["train"], args.out, args.vocab_size,
                              args.grass)
    print(f"{args.out}/tokenizer.model: vocab {args.vocab_size}, trained by {trainer}",
          file=sys.stderr)


if __name__ == "__main__":
    main()
