"""Evaluation: how good m3mem is, on the public benchmark and on a user's own videos.

- ``m3bench``: answer M3-Bench's questions from memory of its videos and grade them.
- ``judge``: graders for answers (a chat model, or a normalised string match).
- ``metrics``: perception metrics (face verification, DER, WER, identity precision
  and recall) built on jiwer, pyannote.metrics and scikit-learn.

The ``m3mem eval`` command is defined here. Importing this package is cheap: each
module imports its libraries when a command runs.
"""
from __future__ import annotations

import json
from pathlib import Path


def add_parser(sub, common) -> None:
    """Add ``eval m3bench`` and ``eval perception {faces,der,wer,identity}`` to the m3mem parser."""
    p = sub.add_parser("eval", help="measure m3mem: M3-Bench accuracy and perception metrics",
                       description="m3mem eval m3bench ... | m3mem eval perception {faces,der,wer,identity} ...")
    esub = p.add_subparsers(dest="eval_command", required=True)

    m = esub.add_parser("m3bench", help="answer and grade M3-Bench questions (robot.json / web.json)")
    m.add_argument("--annotations", required=True, help="M3-Bench annotation file (robot.json, web.json)")
    m.add_argument("--videos", help="folder searched (recursively) for the videos, by file name; "
                                    "without it only videos that already have a store are answered")
    m.add_argument("--judge", help="chat backend that grades answers (e.g. openai:http://host:8000/v1); "
                                   "default: normalised string match")
    m.add_argument("--out", help="JSON lines file, one line per question (default: STORE/m3bench_<name>.jsonl)")
    m.add_argument("--resume", action="store_true", help="keep the questions already in --out; answer the rest")
    m.add_argument("--video", dest="video_ids", action="append", metavar="ID", help="only this video (repeatable)")
    common(m)

    per = esub.add_parser("perception", help="face verification, diarization error rate, word error rate, "
                                             "identity precision and recall",
                          description="with no metric: every measure on the test media, one table per backend")
    from m3mem.eval.perception import add_arguments as add_perception_arguments

    add_perception_arguments(per, common)
    psub = per.add_subparsers(dest="metric", required=False)

    f = psub.add_parser("faces", help="face verification on a pair list (CSV: file_x,file_y,same_person)")
    f.add_argument("--pairs", required=True, help="pair list CSV")
    f.add_argument("--root", help="folder the pair paths are relative to (default: the pair list's folder, "
                                  "then its parent)")
    f.add_argument("--threshold", type=float, help="same person at or above (default: the backend's calibrated one)")
    common(f, store=False)

    d = psub.add_parser("der", help="diarization error rate against an RTTM reference")
    d.add_argument("--reference", required=True, help="reference RTTM")
    d.add_argument("--file-id", help="which file of the reference RTTM (default: the only one, or the video's name)")
    d.add_argument("--collar", type=float, default=0.0, help="seconds forgiven around reference boundaries (total)")
    d.add_argument("--skip-overlap", action="store_true", help="do not score overlapped speech")
    _hypothesis_args(d, "RTTM", common)

    w = psub.add_parser("wer", help="word error rate against a reference transcript (text or STM)")
    w.add_argument("--reference", required=True, help="reference transcript (.txt, or .stm)")
    _hypothesis_args(w, "text file", common)

    i = psub.add_parser("identity", help="identity precision and recall against a truth timeline")
    i.add_argument("--truth", required=True, help="truth timeline (CSV start,end,person or RTTM)")
    i.add_argument("--kind", choices=["face", "voice"], default="face", help="which appearances to score")
    i.add_argument("--level", choices=["person", "node"], default="person",
                   help="label predicted spans by person (character) or by face/voice id")
    _hypothesis_args(i, "timeline (CSV or RTTM)", common)


def _hypothesis_args(p, what: str, common) -> None:
    p.add_argument("--hypothesis", help=f"hypothesis {what}; default: what m3mem perceived (--store, --video)")
    p.add_argument("--store", help="store whose perception is the hypothesis")
    p.add_argument("--video", help="video in the store (file name; default: the only one)")
    common(p, store=False)


def run_command(args, cfg, progress=None) -> int:
    if args.eval_command == "m3bench":
        return _cmd_m3bench(args, cfg, progress)
    if args.metric is None:
        from m3mem.eval.perception import run_command as run_perception

        return run_perception(args, cfg, progress)
    return {"faces": _cmd_faces, "der": _cmd_der, "wer": _cmd_wer, "identity": _cmd_identity}[args.metric](args, cfg)


def _cmd_m3bench(args, cfg, progress) -> int:
    from m3mem.eval.judge import load_judge
    from m3mem.eval.m3bench import run_m3bench

    judge = load_judge(args.judge, cfg.device)
    report = run_m3bench(args.annotations, args.store, videos_dir=args.videos, config=cfg, judge=judge,
                         results_path=args.out, resume=args.resume, video_ids=args.video_ids, progress=progress)
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        print(f"M3-Bench {Path(args.annotations).name}, judge: {report.judge}, "
              f"{len(report.results)} questions answered in {report.wall_s:.1f} s\n")
        print(report.table())
        for v in report.videos:
            if v.status == "failed":
                print(f"ingest failed: {v.video_id}: {v.error}")
    return 0


def _print(args, title: str, result: dict, extra: dict | None = None) -> int:
    out = {**result, **(extra or {})}
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(title)
    for k, v in out.items():
        if isinstance(v, float):
            v = f"{v:.4f}"
        elif isinstance(v, (dict, list)):
            if not v:
                continue
            v = json.dumps(v, ensure_ascii=False)
        print(f"  {k:20s} {v}")
    return 0


def _store_hypothesis(args, what: str):
    """The store and the video row whose perception is the hypothesis."""
    from m3mem.errors import InputError
    from m3mem.eval.metrics import store_video
    from m3mem.store import Store

    if not args.store:
        raise InputError(f"give --hypothesis {what}, or --store (and --video) to score what m3mem perceived")
    store = Store.open(args.store, create=False, read_only=True)
    return store, store_video(store, args.video)


def _cmd_faces(args, cfg) -> int:
    from models.registry import load_face_model

    from m3mem.eval.metrics import face_verification, read_pairs, score_face_pairs

    pairs_path = Path(args.pairs)
    pairs = read_pairs(pairs_path)
    root = Path(args.root) if args.root else pairs_path.parent
    if not args.root and not (root / pairs[0][0]).exists() and (root.parent / pairs[0][0]).exists():
        root = root.parent  # pair lists often name files relative to the data folder above them
    model = load_face_model(cfg.face_model, cfg.device)
    threshold = args.threshold if args.threshold is not None else (cfg.face_threshold or model.match_threshold)
    scores, labels, missed = score_face_pairs(model, pairs, root, cfg.max_frame_side_px)
    result = face_verification(scores, labels, threshold)
    return _print(args, f"Face verification, {cfg.face_model}, {len(pairs)} pairs from {pairs_path}",
                  result.to_json(), {"images_without_face": missed})


def _cmd_der(args, cfg) -> int:
    from m3mem.errors import InputError
    from m3mem.eval.metrics import diarization_error_rate, read_rttm, store_timeline

    ref_all = read_rttm(args.reference)
    uem = None
    if args.hypothesis:
        hyp_all = read_rttm(args.hypothesis)
        fid = args.file_id or (next(iter(ref_all)) if len(ref_all) == 1 else None)
        if fid is None:
            raise InputError(f"{args.reference} holds files {', '.join(ref_all)}; say which one with --file-id")
        hyp = hyp_all.get(fid) or (next(iter(hyp_all.values())) if len(hyp_all) == 1 else [])
        source = args.hypothesis
    else:
        store, video = _store_hypothesis(args, "RTTM")
        with store:
            hyp = store_timeline(store, video.name, kind="voice", level="node")
        fid = args.file_id or (next(iter(ref_all)) if len(ref_all) == 1 else Path(video.name).stem)
        uem = (0.0, video.duration_s)  # the whole file was listened to: speech anywhere else is a false alarm
        source = f"{args.store} ({video.name})"
    if fid not in ref_all:
        raise InputError(f"{args.reference} has no file {fid!r}; it holds {', '.join(ref_all)}")
    result = diarization_error_rate(ref_all[fid], hyp, collar_s=args.collar, skip_overlap=args.skip_overlap, uem=uem)
    return _print(args, f"Diarization error rate of {source} against {args.reference} ({fid})", result.to_json())


def _cmd_wer(args, cfg) -> int:
    from m3mem.eval.metrics import read_transcript, store_transcript, word_error_rate

    reference = read_transcript(args.reference)
    if args.hypothesis:
        hypothesis, source = read_transcript(args.hypothesis), args.hypothesis
    else:
        store, video = _store_hypothesis(args, "text file")
        with store:
            hypothesis = store_transcript(store, video.name)
        source = f"{args.store} ({video.name})"
    result = word_error_rate(reference, hypothesis)
    return _print(args, f"Word error rate of {source} against {args.reference}", result.to_json(),
                  {"hypothesis": hypothesis} if args.verbose else None)


def _cmd_identity(args, cfg) -> int:
    from m3mem.eval.metrics import identity_precision_recall, read_timeline, store_timeline

    truth = read_timeline(args.truth)
    uem = None
    if args.hypothesis:
        predicted, source = read_timeline(args.hypothesis), args.hypothesis
    else:
        store, video = _store_hypothesis(args, "timeline")
        with store:
            predicted = store_timeline(store, video.name, kind=args.kind, level=args.level)
        uem = (0.0, video.duration_s)
        source = f"{args.store} ({video.name}, {args.kind}s by {args.level})"
    result = identity_precision_recall(truth, predicted, uem=uem)
    return _print(args, f"Identity of {source} against {args.truth}", result.to_json())
