"""The ``m3mem`` command. Scripts rely on the subcommand names and ``--json`` shapes here."""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from m3mem.config import Config, load_config
from m3mem.errors import InputError, M3memError

log = logging.getLogger("m3mem")

DEMO_QUESTION = "What did the speaker ask people to do for their country?"


def _common(p: argparse.ArgumentParser, store: bool = True) -> None:
    if store:
        p.add_argument("--store", required=True, help="memory store folder")
    p.add_argument("--config", help="TOML config file (also $M3MEM_CONFIG)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config value")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p.add_argument("-q", "--quiet", action="store_true", help="only errors")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="m3mem", description="Long-term multimodal memory of video.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("ingest", help="add videos or audio files (or folders of them) to a store")
    p.add_argument("paths", nargs="+", help="files, folders (recursive), quoted glob patterns, list files (.txt: one "
                   "input per line) or M3-Agent manifests (.jsonl with video_path)")
    p.add_argument("--retry-failed", action="store_true", help="take clips that failed before again")
    p.add_argument("--workers", type=int, help="parallel workers; more than 1 starts a local Ray instance "
                   "(default 1: one process, no Ray)")
    p.add_argument("--ray", dest="ray_address", help="join a running Ray cluster: 'auto' on one of its nodes, or the "
                   "head's HOST:PORT (docs/cluster.md)")
    _common(p)

    p = sub.add_parser("search", help="clips whose memory matches a query")
    p.add_argument("query")
    p.add_argument("--top-k", type=int, default=5)
    p.add_argument("--before", type=float, help="only memory from clips that end by this time (seconds)")
    _common(p)

    p = sub.add_parser("ask", help="answer a question from memory, citing clips")
    p.add_argument("question")
    p.add_argument("--before", type=float, help="only memory from clips that end by this time (seconds)")
    _common(p)

    p = sub.add_parser("people", help="the people in memory and when they appear; rename, merge or split them",
                       description="m3mem people [rename PERSON NAME | merge PERSON OTHER | split PERSON FACE_OR_VOICE... | forget PERSON]")
    p.add_argument("action", nargs="?", choices=["list", "rename", "merge", "split", "forget"], default="list")
    p.add_argument("args", nargs="*", help="PERSON is a character id, a face/voice id or a name")
    _common(p)

    p = sub.add_parser("demo", help="ingest the bundled sample and answer a question about it")
    p.add_argument("--store", help="store folder (default: a fresh temporary folder)")
    p.add_argument("--question", default=DEMO_QUESTION)
    _common(p, store=False)

    p = sub.add_parser("config", help="print the effective configuration")
    _common(p, store=False)

    p = sub.add_parser("serve", help="the web app: library, questions with cited clips, people, pictures")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; others need --auth)")
    p.add_argument("--port", type=int, default=7860)
    p.add_argument("--auth", default=os.environ.get("M3MEM_UI_AUTH"), metavar="USER:PASSWORD",
                   help="require this login (also $M3MEM_UI_AUTH)")
    p.add_argument("--allow", action="append", default=[], metavar="DIR",
                   help="a server folder users may ingest from and play media from (repeatable)")
    p.add_argument("--max-upload-mb", type=float, default=2048, help="largest upload accepted (default 2048)")
    _common(p)

    from m3mem.eval import add_parser as add_eval_parser

    add_eval_parser(sub, _common)
    return parser


def _config(args) -> Config:
    overrides = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            raise M3memError(f"--set expects KEY=VALUE, got {item!r}")
        overrides[key.strip()] = value.strip()
    for key in ("workers", "ray_address"):
        if getattr(args, key, None) is not None:
            overrides[key] = getattr(args, key)
    if getattr(args, "top_k", None) is not None:
        overrides["top_k"] = args.top_k
    return load_config(args.config, overrides)


def _setup_logging(args) -> None:
    level = logging.DEBUG if args.verbose else logging.ERROR if args.quiet or args.json else logging.INFO
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    # model libraries are chatty at import time; keep them to warnings
    for noisy in ("sentence_transformers", "transformers", "urllib3", "httpx", "filelock", "faiss.loader"):
        logging.getLogger(noisy).setLevel(max(level, logging.WARNING))


def _progress(enabled: bool):
    if not enabled:
        return None
    from tqdm import tqdm

    bars: dict[str, tqdm] = {}

    def update(label: str, done: int, total: int) -> None:
        bar = bars.get(label)
        if bar is None:
            bar = bars[label] = tqdm(total=total, desc=label[:40], unit="clip", file=sys.stderr, leave=True)
        if done != bar.n:
            bar.update(done - bar.n)
        if done >= total:
            bar.close()

    return update


def _fmt(t: float) -> str:
    m, s = divmod(t, 60)
    return f"{int(m)}:{s:04.1f}"


def cmd_ingest(args, cfg: Config) -> int:
    from m3mem.memory import Memory

    with Memory(args.store, cfg) as mem:
        report = mem.ingest(args.paths, progress=_progress(not (args.quiet or args.json)),
                            retry_failed=args.retry_failed)
    out = report.to_json()
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        for f in report.files:
            line = f"{f.status:8s} {f.path}  clips done {f.clips_done}, skipped {f.clips_skipped}, failed {f.clips_failed}"
            print(line + (f"\n         {f.error}" if f.error else ""))
        rtf = out["real_time_factor"]
        print(f"{len(report.files)} files, {out['clips_done']} clips done, {out['clips_failed']} failed, "
              f"{out['clips_skipped']} skipped in {out['wall_s']:.1f} s" + (f" (real-time factor {rtf:.3f})" if rtf else ""))
        if out.get("cluster"):
            nodes = out["cluster"]["clips_per_node"]
            print(f"{out['cluster']['workers']} Ray workers; clips perceived per node: "
                  + (", ".join(f"{n[:8]} {c}" for n, c in sorted(nodes.items())) or "none"))
    return 1 if report.failed else 0


def cmd_search(args, cfg: Config) -> int:
    from m3mem.memory import Memory

    with Memory(args.store, cfg, read_only=True) as mem:
        hits = mem.search(args.query, top_k=args.top_k, before_s=args.before)
    if args.json:
        print(json.dumps({"query": args.query, "results": [h.to_json() for h in hits]}, indent=2))
    else:
        if not hits:
            print("no matching clips")
        for h in hits:
            print(f"{h.score:.3f}  {h.video}  {_fmt(h.start_s)}-{_fmt(h.end_s)}")
            for line in h.lines[:5]:
                print(f"        {line}")
    return 0


def cmd_ask(args, cfg: Config) -> int:
    from m3mem.memory import Memory

    with Memory(args.store, cfg, read_only=True) as mem:
        answer = mem.ask(args.question, before_s=args.before)
    if args.json:
        print(json.dumps(answer.to_json(), indent=2))
    else:
        _print_answer(answer)
    return 0


def _print_answer(answer) -> None:
    print(f"Answer: {answer.answer}")
    for c in answer.citations:
        print(f"  cited: {c['video']}  {_fmt(c['start'])}-{_fmt(c['end'])}")


def cmd_people(args, cfg: Config) -> int:
    from m3mem import people as people_edit
    from m3mem.memory import Memory

    if args.action != "list":
        need = {"rename": 2, "merge": 2, "split": 2, "forget": 1}[args.action]
        if len(args.args) < need:
            raise InputError(f"people {args.action} needs at least {need} arguments; see m3mem people --help")
        with Memory(args.store, cfg) as mem:
            if args.action == "rename":
                cid = people_edit.rename(mem.store, args.args[0], " ".join(args.args[1:]))
            elif args.action == "merge":
                cid = people_edit.merge(mem.store, args.args[0], args.args[1])
            elif args.action == "split":
                cid = people_edit.split(mem.store, args.args[0], args.args[1:])
            else:
                from m3mem.forget import forget_person

                report = forget_person(mem.store, args.args[0])
                if args.json:
                    print(json.dumps({"action": "forget", "id": report.person, **report.to_json()}))
                else:
                    print(f"forget: {report.person} ({len(report.entities)} faces and voices, {report.lines} memory lines, "
                          f"{report.embeddings} vectors, {report.crops} crops removed)")
                return 0
        print(json.dumps({"action": args.action, "id": cid}) if args.json else f"{args.action}: {cid}")
        return 0
    with Memory(args.store, cfg, read_only=True) as mem:
        people = mem.people()
    if args.json:
        print(json.dumps({"people": [p.to_json() for p in people]}, indent=2))
    else:
        for p in people:
            label = f"{p.id}" + (f" ({p.name})" if p.name else "")
            print(f"{label}: faces {', '.join(p.faces) or '-'}; voices {', '.join(p.voices) or '-'}")
            for a in p.appearances[:8]:
                print(f"    {a['kind']:5s} {a['video']}  {_fmt(a['start'])}-{_fmt(a['end'])}")
            if len(p.appearances) > 8:
                print(f"    ... {len(p.appearances) - 8} more")
    return 0


def sample_dir() -> Path:
    """The bundled sample: data/sample beside the packages (a source checkout or an editable install)."""
    here = Path(__file__).resolve().parent.parent / "data" / "sample"
    if here.is_dir():
        return here
    raise M3memError(f"the bundled sample is missing ({here}); run the demo from a source checkout of m3mem")


def cmd_demo(args, cfg: Config) -> int:
    import tempfile

    from m3mem.memory import Memory

    store = Path(args.store) if args.store else Path(tempfile.mkdtemp(prefix="m3mem-demo-"))
    sample = sample_dir()
    if not args.json:
        print(f"Ingesting {sample} into {store} ...")
    with Memory(store, cfg) as mem:
        report = mem.ingest([sample], progress=_progress(not (args.quiet or args.json)))
        answer = mem.ask(args.question)
        people = mem.people()
    if args.json:
        print(json.dumps({"store": str(store), "ingest": report.to_json(), "question": args.question,
                          **answer.to_json(), "people": len(people)}, indent=2))
        return 1 if report.failed else 0
    out = report.to_json()
    print(f"{len(report.files)} files, {out['clips_done']} clips, {len(people)} people, {out['wall_s']:.1f} s")
    print(f"\nQuestion: {args.question}")
    _print_answer(answer)
    print(f"\nTry: m3mem search 'somebody speaking' --store {store}   |   m3mem people --store {store}")
    return 1 if report.failed else 0


def cmd_config(args, cfg: Config) -> int:
    if args.json:
        print(json.dumps(cfg.to_dict(), indent=2))
    else:
        for k, v in cfg.to_dict().items():
            print(f"{k} = {v!r}")
    return 0


def cmd_eval(args, cfg: Config) -> int:
    from m3mem.eval import run_command

    return run_command(args, cfg, progress=_progress(not (args.quiet or args.json)))


def cmd_serve(args, cfg: Config) -> int:
    from ui.app import parse_auth, serve

    serve(args.store, cfg, host=args.host, port=args.port, auth=parse_auth(args.auth),
          allowed_dirs=tuple(args.allow), max_upload_mb=args.max_upload_mb)
    return 0


COMMANDS = {
    "ingest": cmd_ingest, "search": cmd_search, "ask": cmd_ask, "people": cmd_people,
    "demo": cmd_demo, "config": cmd_config, "eval": cmd_eval,
    "serve": cmd_serve,
}


def _quiet_library_warnings() -> None:
    import warnings

    # third-party import-time deprecation notices say nothing to an m3mem user
    warnings.filterwarnings("ignore", message="pkg_resources is deprecated")
    warnings.filterwarnings("ignore", category=DeprecationWarning, module="resemblyzer")


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # offline defaults never need the hub
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    _quiet_library_warnings()
    parser = build_parser()
    args = parser.parse_args(argv)
    _setup_logging(args)
    try:
        cfg = _config(args)
        return COMMANDS[args.command](args, cfg)
    except M3memError as e:
        print(f"m3mem: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("m3mem: interrupted; finished clips are kept, run the same command to resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
