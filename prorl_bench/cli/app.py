"""The ``prorl-bench`` command: a thin Hydra entry point around ``trainer.train``.

Kept in an importable module (the joblib launcher pickles the task function). Each job:
validates its config, writes the resolved config, pins torch threads, trains, and writes
``summary.json`` — with ``status: failed`` and the error text if anything raised.
"""

from __future__ import annotations

import errno
import os
import sys
import warnings
from pathlib import Path
from typing import Any, NoReturn

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from prorl_bench import searchpath
from prorl_bench.cli.confhelp import force_option_params, register_help
from prorl_bench.cli.job_config import show_job_config
from prorl_bench.config import ConfigError, complete, register_configs, to_config
from prorl_bench.run import provenance
from prorl_bench.run.outputs import SAMPLES, read_jsonl, write_summary
from prorl_bench.run.record import RecordSnapshot, drop_finished_copies, failed_summary
from prorl_bench.run.rundir import RunDirBusy, has_previous_run
from prorl_bench.run.signals import STOP_FILE, Preempted, SweepStopped, ignore_stop_signals_between_jobs
from prorl_bench.run.threads import resolve_threads

register_configs()
register_help()  # `prorl-bench --help`: every key with its default and meaning

EXIT_PREEMPTED = 75  # EX_TEMPFAIL: try again (re-running the same command resumes)

# conf/ lives at the repository top level (the documented layout); an absolute path keeps Hydra from
# resolving it as a Python module relative to this package.
CONF_DIR = str(searchpath.CONF_DIR)  # the checkout's conf/, or the copy a wheel ships


class DiskFull(OSError):
    """A write failed for lack of space (the message names the file)."""

    def __reduce__(self):
        return (type(self), self.args)


def _record_failure(e: BaseException, run_dir: Path, snapshot: RecordSnapshot | None) -> BaseException:
    """Write a failed summary for ``e`` — except where that would overwrite someone else's record: a
    directory held by another process, or an existing run whose restart stopped before a new step (its
    record files are put back byte-identical: a refusal, whatever the error)."""
    if isinstance(e, RunDirBusy):
        if snapshot is not None and snapshot.kept_finished:
            drop_finished_copies(run_dir)
        return e
    if snapshot is not None and not snapshot.new_steps_logged():
        _restore(snapshot)
        return e
    run_dir.mkdir(parents=True, exist_ok=True)
    write_summary(run_dir, failed_summary(e))
    return e


def _restore(snapshot: RecordSnapshot) -> None:
    try:
        snapshot.restore()
    except OSError as err:
        print(f"prorl-bench: could not restore {err.filename}: {err.strerror}", file=sys.stderr)
        return
    print(f"prorl-bench: {snapshot.run_dir}: stopped before a new step; the existing run's record is unchanged",
          file=sys.stderr)  # fmt: skip


def completed_job(run_dir: Path, cfg: DictConfig) -> dict[str, Any] | None:
    """The summary of a job that already completed in ``run_dir`` with exactly this config (its
    ``config_resolved.yaml`` equals ``cfg`` resolved), else None."""
    from prorl_bench.run.checkpoint import finished_summary
    from prorl_bench.run.outputs import RESOLVED_CONFIG

    written = run_dir / RESOLVED_CONFIG
    if not written.is_file() or provenance.config_only(written.read_text()) != OmegaConf.to_yaml(cfg, resolve=True):
        return None
    return finished_summary(run_dir, int(cfg.steps))


def run(cfg: DictConfig) -> float:
    """Run one job of a (multi)run. Returns the last-10% success rate (for sweepers). Every
    summary.json it writes, and its config_resolved.yaml, carry the job's provenance."""
    from prorl_bench.cli.option_code import load_option_code

    load_option_code()  # the checks that live with an option's code, before the config is validated
    hc = HydraConfig.get()
    threads = None
    try:
        threads = resolve_threads(to_config(cfg).hardware.torch_threads, hc.mode == RunMode.MULTIRUN)[0]
    except Exception:  # noqa: BLE001 - _run meets the same error and records it (a failed summary, with provenance)
        pass
    uses_cuda = str(cfg.get("hardware", {}).get("device", "cpu")) != "cpu"
    prov = provenance.collect(list(hc.overrides.task), uses_cuda=uses_cuda, threads=threads)
    with provenance.recording(prov):
        return _run(cfg, prov)


def _run(cfg: DictConfig, prov: dict[str, Any]) -> float:
    from prorl_bench.engines.dispatch import train  # keeps `--help` and config errors fast

    hc = HydraConfig.get()
    multirun = hc.mode == RunMode.MULTIRUN
    cfg = _completed(cfg)  # each option's section: its own keys, defaults filled (config_resolved.yaml)
    run_dir = Path(cfg.run_dir) if cfg.get("run_dir") else Path(hc.runtime.output_dir)
    had_run = has_previous_run(run_dir)  # its record must survive a refused start
    snapshot = RecordSnapshot.take(run_dir) if had_run else None
    stop_file = Path(hc.sweep.dir).resolve() / STOP_FILE if multirun else None
    if multirun and (done := completed_job(run_dir, cfg)) is not None:
        # a resumed sweep (prorl-bench-sweep --resume): this job finished before; touch nothing
        print(f"[prorl-bench] {run_dir}: already completed, skipped (its files are left as they are)")
        return float(done["success_rate/last10"])
    if stop_file is not None:
        ignore_stop_signals_between_jobs()  # the sweep's STOP file stops this worker's jobs
        if stop_file.exists():
            resume = f"prorl-bench-sweep --resume {stop_file.parent}"
            why = f"not started: the sweep was stopped before this job began; `{resume}` runs it"
            if not had_run:  # a directory Hydra has just made for this job: say why it stays empty
                write_summary(run_dir, {"status": "preempted", "error": why, "steps_completed": 0})
            raise SweepStopped(f"{run_dir}: {why}")
    try:
        conf = to_config(cfg)
        threads, source = resolve_threads(conf.hardware.torch_threads, multirun)
        if not multirun:  # a sweep's jobs all say the same: its docs say it once
            print(f"[prorl-bench] torch threads: {threads} (from {source})")
        os.environ["OMP_NUM_THREADS"] = str(threads)
        cache = Path(conf.warmup.cache_dir)
        if not cache.is_absolute():
            cache = Path(hydra.utils.get_original_cwd()) / cache
        if snapshot is not None:
            snapshot.keep_finished(conf.steps)  # extending a finished run: its record stays readable
        summary = train(
            conf,
            run_dir,
            cache,
            threads=threads,
            progress=conf.progress and not multirun,
            resolved_config=provenance.config_text(OmegaConf.to_yaml(cfg, resolve=True), prov),
            stop_file=stop_file,
        )
    except Preempted as e:  # the trainer wrote a checkpoint and summary.json (status: preempted)
        if e.stage is not None and not had_run:  # before training: nothing was written yet, say why
            write_summary(run_dir, {"status": "preempted", "error": str(e), "steps_completed": 0})
        again = f"prorl-bench-sweep --resume {stop_file.parent}" if multirun else "re-run the same command"
        print(f"prorl-bench: {e}; {again} to resume", file=sys.stderr)
        if multirun:
            raise  # a job error, not a process exit: the other jobs of the sweep go on
        raise SystemExit(EXIT_PREEMPTED) from None
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise _record_failure(e, run_dir, snapshot) from None
        _disk_full(e, run_dir, snapshot, multirun)
    except BaseException as e:  # record every failure (also Ctrl-C) before it propagates
        _record_failure(e, run_dir, snapshot)
        if isinstance(e, ConfigError) and not multirun:
            print(f"prorl-bench: config error: {e}", file=sys.stderr)
            raise SystemExit(2) from None
        raise
    if summary.get("status") == "completed":
        drop_finished_copies(run_dir)  # a completed extension's record holds the finished segment
    print(
        f"[prorl-bench] {run_dir}: success_rate first10={summary['success_rate/first10']:.3f} "
        f"last10={summary['success_rate/last10']:.3f}, {summary['time/step_mean'] * 1e3:.1f} ms/step, "
        f"ref share {summary['time/ref_share']:.1%}"
    )
    if not multirun:
        print(final_report(run_dir, summary))
    return float(summary["success_rate/last10"])


def _disk_full(e: OSError, run_dir: Path, snapshot: RecordSnapshot | None, multirun: bool) -> NoReturn:
    """A full disk: one clear message naming the file, the earlier record restored or a failed summary
    written if it still fits; a job error in a sweep (the others go on), exit status 1 alone."""
    msg = f"disk full: could not write {e.filename or run_dir} ({e.strerror}); free space and re-run to resume"
    if snapshot is not None and not snapshot.new_steps_logged():
        _restore(snapshot)
    else:
        try:
            write_summary(run_dir, {"status": "failed", "error": f"DiskFull: {msg}", "traceback": ""})
        except OSError:
            pass
    print(f"prorl-bench: {msg}", file=sys.stderr)
    if multirun:
        raise DiskFull(msg) from None
    raise SystemExit(1) from None


def final_report(run_dir: Path, summary: dict[str, Any], n_prompts: int = 3, n_samples: int = 4) -> str:
    """The end-of-run console summary: final held-out figures, a few real completions from the last
    evaluation (samples.jsonl), and where the files are."""
    lines = []
    val = summary.get("final_val") or {}
    ks = sorted(int(k.split("@")[1]) for k in val if k.startswith("val/pass@"))
    if ks:
        figures = ", ".join(f"pass@{k} {val[f'val/pass@{k}']:.3f}" for k in ks)
        lines.append(f"  held-out (step {val.get('step')}): {figures}, greedy {val.get('val/success_greedy', 0):.3f}")
    rows = read_jsonl(run_dir / SAMPLES)
    last = [r for r in rows if rows and r["step"] == rows[-1]["step"]][:n_prompts]
    for r in last:
        shown = " ".join(f"{s['completion']!r}{'✓' if s['success'] else '✗'}" for s in r["samples"][:n_samples])
        lines.append(f"  {r['prompt']!r} → want {r['target']!r}: greedy {r['greedy']!r}; samples {shown}")
    lines.append(f"  summary: {run_dir / 'summary.json'}  samples: {run_dir / SAMPLES}")
    return "\n".join(lines)


def _completed(cfg: DictConfig) -> DictConfig:
    """``config.complete(cfg)``; the composed ``cfg`` unchanged when it does not validate (``to_config``
    then reports the error, recorded as any other)."""
    try:
        with warnings.catch_warnings():  # to_config warns once, below
            warnings.simplefilter("ignore")
            return complete(cfg)
    except ConfigError:
        return cfg


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="config")
def hydra_main(cfg: DictConfig) -> float:
    return run(cfg)


def main() -> None:
    """``prorl-bench``: check the command line, then hand it to Hydra (``hydra_main``).

    Before Hydra composes anything: a TRL / verl parameter name or a misspelled key gets "did you
    mean" with the bench's key and the value (``confhelp.check_overrides``); a single run's config is
    validated, so a bad value leaves no run directory behind (``preflight.validate_single_run``); a
    SLURM launcher without SLURM is one line. Each is exit status 2 and nothing is written. A single
    run's ``--cfg job`` prints the config the run will use (``job_config``), not Hydra's composition."""
    from prorl_bench.cli import preflight

    provenance.remember_command()  # the launcher's workers record the command the user typed
    args = preflight.rename_moved(sys.argv[1:])  # task.code.timeout_s=3 -> task.timeout_s=3, with a note
    problem = preflight.check(args)
    if problem:
        print(problem, file=sys.stderr)
        raise SystemExit(2)
    sys.argv[1:] = force_option_params(args)  # reset.trigger=X reset.<X's parameter>=v: no "+" needed
    if show_job_config(sys.argv[1:]):  # --cfg job: the selected options' keys, as the run records them
        return
    hydra_main()


if __name__ == "__main__":
    main()
