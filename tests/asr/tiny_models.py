"""Tiny random-weight models in the exact on-disk layouts whisperX loads, built offline.

- ``build_whisper``: a CTranslate2 Whisper folder (model.bin, config.json, vocabulary.json,
  tokenizer.json, preprocessor_config.json) as faster-whisper reads it, converted from a
  transformers ``WhisperForConditionalGeneration`` with d_model 64 and 2 layers. The
  tokenizer is a byte-level BPE with Whisper's special tokens in Whisper's order
  (<|endoftext|> first, then <|startoftranscript|> ... <|notimestamps|> and 1501 timestamps),
  so that faster-whisper's id arithmetic (timestamp_begin = notimestamps + 1) holds.
- ``build_wav2vec2``: a Hugging Face Wav2Vec2ForCTC folder with a letter vocabulary.
- ``build_pyannote``: a pyannote speaker-diarization folder in the layout of
  speaker-diarization-community-1 (config.yaml, segmentation/, embedding/, plda/): the
  segmentation checkpoint whisperX ships for its VAD, a random 32-d x-vector embedding and
  a PLDA of matching size.
- ``build_punkt``: NLTK punkt_tab data with empty parameters (whisperX's alignment splits
  sentences with it and would otherwise download it).

Random weights make garbage text. The Whisper decoder is steered only so that a test can
rely on its shape: output tokens are lower-case letters and spaces (every 5th position
leans to a space, so there are words), and from the 24th position on <|endoftext|> wins,
so decoding stops early instead of running to 448 tokens.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

SPECIALS = ["<|endoftext|>", "<|startoftranscript|>", "<|translate|>", "<|transcribe|>", "<|startoflm|>",
            "<|startofprev|>", "<|nocaptions|>", "<|notimestamps|>"]
TIMESTAMPS = ["<|%.2f|>" % (i * 0.02) for i in range(1501)]
LETTERS = "abcdefghijklmnopqrstuvwxyz"
TEXT_TOKENS_MAX = 22  # <|startoftranscript|> <|notimestamps|> then at most this many tokens


def build_whisper(out: Path) -> Path:
    import ctranslate2
    import torch
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import (PreTrainedTokenizerFast, WhisperConfig, WhisperFeatureExtractor,
                              WhisperForConditionalGeneration)

    hf = out.parent / (out.name + "-transformers")
    hf.mkdir(parents=True)
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS + TIMESTAMPS])
    eot = tok.token_to_id("<|endoftext|>")
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>",
                            unk_token="<|endoftext|>", pad_token="<|endoftext|>").save_pretrained(hf)
    WhisperFeatureExtractor(feature_size=80).save_pretrained(hf)

    d_model = 64
    cfg = WhisperConfig(vocab_size=tok.get_vocab_size(), num_mel_bins=80, d_model=d_model,
                        encoder_layers=2, decoder_layers=2, encoder_attention_heads=2, decoder_attention_heads=2,
                        encoder_ffn_dim=128, decoder_ffn_dim=128, max_source_positions=1500,
                        max_target_positions=448, decoder_start_token_id=tok.token_to_id("<|startoftranscript|>"),
                        pad_token_id=eot, bos_token_id=eot, eos_token_id=eot,
                        # untied, so that steering the output does not feed back through the input
                        tie_word_embeddings=False)
    torch.manual_seed(0)
    model = WhisperForConditionalGeneration(cfg).eval()
    model.generation_config.suppress_tokens = []
    model.generation_config.begin_suppress_tokens = [eot]
    space = tok.token_to_id("\u0120")  # byte-level BPE's space
    # two zero-mean directions of the residual stream: "end now" and "space now"
    end_dir = torch.zeros(d_model)
    end_dir[0], end_dir[1] = 1.0, -1.0
    space_dir = torch.zeros(d_model)
    space_dir[2], space_dir[3] = 1.0, -1.0
    end_dir, space_dir = end_dir / end_dir.norm(), space_dir / space_dir.norm()
    with torch.no_grad():
        emb = model.proj_out.weight
        keep = torch.zeros(emb.shape[0], dtype=torch.bool)
        keep[[tok.token_to_id(c) for c in LETTERS]] = True
        emb[~keep] = 0.0  # every other token scores 0 and loses to the best letter
        letters = emb[keep]
        letters -= (letters @ end_dir)[:, None] * end_dir + (letters @ space_dir)[:, None] * space_dir
        emb[keep] = letters
        emb[eot] = 3.0 * end_dir
        emb[space] = 3.0 * space_dir
        pos = model.model.decoder.embed_positions.weight
        stop_at = 2 + TEXT_TOKENS_MAX
        pos[:stop_at] -= end_dir
        pos[stop_at:] += 2.0 * end_dir
        for j in range(6, stop_at, 5):
            pos[j] += space_dir
    model.save_pretrained(hf)
    ctranslate2.converters.TransformersConverter(
        str(hf), copy_files=["tokenizer.json", "preprocessor_config.json"]).convert(str(out), force=True)
    shutil.rmtree(hf)
    return out


def build_wav2vec2(out: Path) -> Path:
    import torch
    from transformers import (Wav2Vec2Config, Wav2Vec2CTCTokenizer, Wav2Vec2FeatureExtractor, Wav2Vec2ForCTC,
                              Wav2Vec2Processor)

    out.mkdir(parents=True)
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3, "|": 4}
    for c in LETTERS + "'":
        vocab[c] = len(vocab)
    (out / "vocab.json").write_text(json.dumps(vocab))
    tokenizer = Wav2Vec2CTCTokenizer(str(out / "vocab.json"), unk_token="<unk>", pad_token="<pad>",
                                     word_delimiter_token="|")
    features = Wav2Vec2FeatureExtractor(feature_size=1, sampling_rate=16000, padding_value=0.0,
                                        do_normalize=True, return_attention_mask=False)
    Wav2Vec2Processor(feature_extractor=features, tokenizer=tokenizer).save_pretrained(out)
    cfg = Wav2Vec2Config(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=64, conv_dim=(32,) * 7, num_conv_pos_embeddings=16,
                         num_conv_pos_embedding_groups=4, pad_token_id=0)
    torch.manual_seed(0)
    Wav2Vec2ForCTC(cfg).eval().save_pretrained(out)
    return out


EMBEDDING_DIM = 32


def build_pyannote(out: Path) -> Path:
    import lightning
    import pyannote.audio
    import torch
    import whisperx
    from pyannote.audio.core.task import Problem, Resolution, Specifications
    from pyannote.audio.models.embedding.xvector import XVectorMFCC

    for sub in ("segmentation", "embedding", "plda"):
        (out / sub).mkdir(parents=True)
    shutil.copy(Path(whisperx.__file__).parent / "assets" / "pytorch_model.bin",
                out / "segmentation" / "pytorch_model.bin")
    torch.manual_seed(0)
    emb = XVectorMFCC(dimension=EMBEDDING_DIM)
    # the checkpoint layout pyannote's Model.from_pretrained reads (as Lightning writes it)
    torch.save({
        "state_dict": emb.state_dict(),
        "hyper_parameters": dict(emb.hparams),
        "pytorch-lightning_version": lightning.__version__,
        "pyannote.audio": {
            "versions": {"pyannote.audio": pyannote.audio.__version__, "torch": torch.__version__},
            "architecture": {"module": XVectorMFCC.__module__, "class": XVectorMFCC.__name__},
            "specifications": Specifications(problem=Problem.REPRESENTATION, resolution=Resolution.CHUNK,
                                             duration=3.0),
        },
    }, out / "embedding" / "pytorch_model.bin")
    lda_dim = 16
    rng = np.random.default_rng(0)
    lda = np.linalg.qr(rng.standard_normal((EMBEDDING_DIM, EMBEDDING_DIM)))[0][:, :lda_dim]
    np.savez(out / "plda" / "xvec_transform.npz", mean1=np.zeros(EMBEDDING_DIM), mean2=np.zeros(lda_dim), lda=lda)
    np.savez(out / "plda" / "plda.npz", mu=np.zeros(lda_dim), tr=np.eye(lda_dim), psi=np.linspace(2.0, 0.5, lda_dim))
    # community-1's config, with the thresholds of a multi-label (not powerset) segmentation model
    (out / "config.yaml").write_text(
        "dependencies:\n"
        f"  pyannote.audio: {pyannote.audio.__version__}\n"
        "pipeline:\n"
        "  name: pyannote.audio.pipelines.SpeakerDiarization\n"
        "  params:\n"
        "    clustering: VBxClustering\n"
        "    embedding: $model/embedding\n"
        "    embedding_batch_size: 8\n"
        "    embedding_exclude_overlap: true\n"
        "    plda: $model/plda\n"
        "    segmentation: $model/segmentation\n"
        "    segmentation_batch_size: 8\n"
        "params:\n"
        "  clustering: {threshold: 0.6, Fa: 0.07, Fb: 0.8}\n"
        "  segmentation: {threshold: 0.5, min_duration_off: 0.0}\n"
    )
    return out


def build_punkt(root: Path, language: str = "english") -> Path:
    folder = root / "tokenizers" / "punkt_tab" / language
    folder.mkdir(parents=True)
    for name in ("collocations.tab", "sent_starters.txt", "abbrev_types.txt", "ortho_context.tab"):
        (folder / name).write_text("")
    return root
