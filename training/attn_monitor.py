"""Attention you can watch while it trains, and what each head does.

At every eval (or every `wandb.attn_interval` steps) the model runs, in eval mode with no grad, on a fixed
probe text (attn.probe_text, or the start of the val split) and on the seeded role probe (attn.role_batch
sequences of a start token, R random ordinary tokens and the same R again: insight/roles.py), and the run
records:
  - per layer and head: the map statistics (entropy, sink mass, mean distance, the decay exponent gamma and
    its fit's R², insight/stats.py), the role scores (prev_token on the probe text; duplicate_token and
    induction on the role probe) and ablation_dloss (the probe text's loss with the head removed, minus the
    intact loss: insight/ablation.py, mode attn.ablation), as W&B scalars `attn/L{layer}.H{head}/{column}`
    and rows of `out_dir/attn/stats.csv` (STATS_COLUMNS). A score that cannot be computed (a probe too short)
    is `nan`; ablation_dloss with attn.ablation=off (or under FSDP, whose sharded layers cannot be re-run one
    by one) is left empty and logs no W&B key;
  - a heatmap grid of every head of the configured layers, as `out_dir/attn/layer_{L}/step_{S}.png` and a W&B
    image under `attn/layer_{L}` (one key per layer, so the media panel steps through training), and beside
    it the zoom on the last 64 queries over their last 64 keys, `step_{S}_zoom.png` and `attn/layer_{L}_zoom`
    (for a probe text longer than insight.heatmap.LABEL_MAX_T = 48 tokens: a shorter map is drawn whole with
    every token labelled, which is all the zoom would show);
  - the interactive explorer of every layer and head (insight/explorer/), as
    `out_dir/attn/explorer/step_{S}.html` and a W&B Html under `attn/explorer`;
  - the heads over training (insight/role_plot.py): every head's induction score against the step with the
    val ICL score below, `out_dir/attn/heads_over_training.png` and W&B image `attn/heads_over_training`.
  - the circuit (insight/circuits.py): for each head of layer 1 and above, its strongest Q-, K- and V-composition
    source among the heads of earlier layers and that edge's z (composition_zscores, default arguments: the
    rotation z over every RoPE distance; K and V per kv head, a query head showing its kv head's), as the
    stats.csv columns CIRCUIT_COLUMNS (`{kind}_source` "L0.H2", `{kind}_z`; empty for layer 0, which reads no
    head, and under FSDP, whose sharded weights are not whole here) and W&B scalars `attn/circuit/{kind}/L{l}.H{h}`
    = that z. The summary line then names the circuit of the strongest induction head: its strongest K-composer,
    the z, the drop of its induction score when that source is path-ablated from its key input (once, on the
    final weights) and the first snapshot from which that source stays the strongest (`summary`, `formed_at`).
The evals' val ICL scores are kept in `out_dir/attn/icl.csv` (step, icl_score) for that picture. Both CSV
files hold one row per step (and layer and head) across crashes and resumes (`_drop_rows_after`).
"""
from __future__ import annotations

import csv
import io
import math
import time
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import torch

from common.errors import UserError
from common.writes import append_text, write_file
from data.prepare import PreparedData
from insight.ablation import ablation_dloss
from insight.circuit_plot import draw_circuit
from insight.circuits import (COMPOSITION_KINDS, Edge, composition_zscores, head_name, path_ablation,
                              strongest_edges)
from insight.explorer import ExplorerOptions, HeadScores, write_explorer
from insight.heatmap import LABEL_MAX_T, HeatmapCanvas
from insight.role_plot import draw_heads_over_training, head_series, induction_heads, induction_summary
from insight.roles import ROLE_NAMES, prev_token_score, probe_length, probe_role_scores, role_label, role_probe
from insight.stats import STAT_NAMES, head_stats
from model.gpt import GPT
from training.config import RunConfig
from training.logger import RunLogger
from training.runtime import Runtime
from training.run_dir import could_not_write

STATS_FILE = "stats.csv"
CIRCUIT_COLUMNS = tuple(f"{kind}_{what}" for kind in COMPOSITION_KINDS for what in ("source", "z"))
STATS_COLUMNS = ("step", "layer", "head", *STAT_NAMES, *ROLE_NAMES, "ablation_dloss", *CIRCUIT_COLUMNS)
ICL_FILE = "icl.csv"
ICL_COLUMNS = ("step", "icl_score")
PICTURE_FILE = "heads_over_training.png"
EXPLORER_MAX_BYTES = 4_000_000  # per snapshot (a run writes one per eval): q/k/v for the step-by-step view beyond it are left out
ROLE_PROBE_SEED = 0  # the role probe is the same in every run of a tokenizer and block size: runs compare


def default_layers(n_layer: int) -> list[int]:
    """First, middle and last layer."""
    return sorted({0, n_layer // 2, n_layer - 1})


def probe_ids(cfg: RunConfig, prepared: PreparedData, block_size: int) -> list[int]:
    """The probe's token ids: attn.probe_text encoded, or the first block_size tokens of the val split."""
    if cfg.attn.probe_text:
        try:
            ids = prepared.tokenizer.encode(cfg.attn.probe_text)
        except UserError as e:  # e.g. characters a char-level vocabulary lacks
            raise UserError(f"attn.probe_text: {e}") from None
        if not ids:
            raise UserError("attn.probe_text encodes to no tokens: give it some text, or remove it to probe "
                            "with the start of the validation split")
        return ids[:block_size]
    return [int(t) for t in prepared.stream("val").read(0, block_size)]


class Probes:
    """The inputs of a snapshot and its forward passes. Under FSDP every pass is a collective over the
    shards, so the other processes run exactly these passes too (training/parallel.MonitorFollower)."""

    def __init__(self, cfg: RunConfig, model: GPT, prepared: PreparedData, rt: Runtime):
        block_size = model.config.block_size
        self.ids = probe_ids(cfg, prepared, block_size)
        self.text = torch.tensor([self.ids], dtype=torch.long, device=rt.device)  # (1, T)
        self.roles = None  # (role_batch, 1 + 2R), or None for a block too short for a role probe (R < 1)
        R = probe_length(block_size)
        self.role_note = f"block_size {block_size} is too short for it: NaN"
        if R >= 1:
            self.role_note = (f"{cfg.attn.role_batch} × a start token, {R} random tokens and the same {R} again, "
                              f"seed {ROLE_PROBE_SEED}")
            self.roles = role_probe(prepared.tokenizer.ordinary_ids(), prepared.tokenizer.start_id, block_size,
                                    batch=cfg.attn.role_batch, seed=ROLE_PROBE_SEED).to(rt.device)
        # one token predicts nothing: there is no loss to lose
        self.ablation = "off" if cfg.train.parallel == "fsdp" or len(self.ids) < 2 else cfg.attn.ablation

    def run(self, model: GPT) -> tuple[dict, dict[str, np.ndarray], np.ndarray | None]:
        """(attention internals of the probe text per layer, {role: (n_layer, n_head)}, ablation_dloss
        (n_layer, n_head) or None when off)."""
        internals = model.attention_internals(self.text)
        n_layer, n_head = model.config.n_layer, model.config.n_head
        roles = {"prev_token": np.stack([prev_token_score(internals[layer].weights) for layer in range(n_layer)])}
        if self.roles is None:
            roles.update(duplicate_token=np.full((n_layer, n_head), np.nan), induction=np.full((n_layer, n_head), np.nan))
        else:
            roles.update(probe_role_scores(model, self.roles))
        dloss = ablation_dloss(model, self.text, self.ablation) if self.ablation != "off" else None
        return internals, roles, dloss


def sources_by_target(edges: Iterable[Edge]) -> dict[tuple[int, int], dict[str, tuple[str, float]]]:
    """{(layer, head): {kind: (source head's name, z)}} from insight.circuits.strongest_edges: each target's
    strongest source per kind, named as stats.csv writes it."""
    found: dict[tuple[int, int], dict[str, tuple[str, float]]] = {}
    for kind, source, target, z in edges:
        found.setdefault(target, {})[kind] = (head_name(*source), z)
    return found


def formed_at(rows: Iterable[Sequence], target: tuple[int, int], source: str) -> int | None:
    """The first snapshot step from which `source` stays the strongest K-composer into `target`, from rows
    (step, layer, head, K source) ('' where not measured: it breaks the run); None unless it is the last one's.
    A later row for the same step replaces an earlier one."""
    by_step = {int(step): str(name) for step, layer, head, name in rows if (int(layer), int(head)) == tuple(target)}
    first = None
    for step in sorted(by_step, reverse=True):
        if by_step[step] != source:
            break
        first = step
    return first


def circuit_text(source: str, target: tuple[int, int], z: float, drop: float | None, formed: int | None) -> str:
    """e.g. "circuit: L0.H2 -K-> L1.H1 (z 66.3, path ablation -0.75 induction) formed at step 350"."""
    ablated = (f"path ablation {drop:.2f} induction" if drop is not None and math.isfinite(drop)
               else "path ablation not measured")
    when = f" formed at step {formed}" if formed is not None else ""
    return f"circuit: {source} -K-> {head_name(*target)} (z {z:.1f}, {ablated}){when}"


def _row_step(row: list[str], width: int = len(STATS_COLUMNS)) -> int | None:
    """The step of a CSV row of `width` columns, or None for a row that is not one of ours (cut short)."""
    if len(row) != width:
        return None
    try:
        return int(row[0])
    except ValueError:
        return None


def _cell(value: float | None) -> str:
    """A CSV cell: '' for a score not measured, 'nan' for one measured but undefined, else repr."""
    if value is None:
        return ""
    return "nan" if math.isnan(value) else repr(float(value))


def _float(cell: str) -> float:
    try:
        return float(cell)
    except ValueError:
        return math.nan


class AttentionMonitor:
    def __init__(self, cfg: RunConfig, model: GPT, prepared: PreparedData, logger: RunLogger, rt: Runtime,
                 start_step: int = 0):
        self.model = model
        self.logger = logger
        self.interval = cfg.wandb.attn_interval
        self.layers_drawn = cfg.attn.layers if cfg.attn.layers is not None else default_layers(model.config.n_layer)
        self.probes = Probes(cfg, model, prepared, rt)
        self.tokens = prepared.tokenizer.token_strings(self.probes.ids)
        # one canvas per picture, for every drawn layer in turn (their maps share a shape, tokens and heads; only
        # the maps and the title change): the probe's token labels are laid out and rendered once a run, not once a
        # layer (a zoom's 512 labels drawn whole ~0.6 s on a 2-core CPU, redrawn over its kept pixels ~0.2 s)
        self.maps_canvas = HeatmapCanvas(self.tokens)
        # shorter probes: the full map labels every token, a zoom would repeat it
        self.zoom_canvas = HeatmapCanvas(self.tokens, zoom=True) if len(self.probes.ids) > LABEL_MAX_T else None
        self.out_dir = Path(cfg.out_dir)
        self.dir = self.out_dir / "attn"
        with could_not_write(self.dir, self.out_dir):  # out_dir/attn being a file: refused at the start
            self.dir.mkdir(parents=True, exist_ok=True)
        self.stats_path = self.dir / STATS_FILE
        self.icl_path = self.dir / ICL_FILE
        self.picture_path = self.dir / PICTURE_FILE
        # what the picture and the summary are drawn from: (step, layer, head, induction) and (step, icl)
        self.induction_rows: list[tuple[int, int, int, float]] = []
        self.k_rows: list[tuple[int, int, int, str, float]] = []  # (step, layer, head, K source, z): the circuit
        self.circuit = cfg.train.parallel != "fsdp"  # sharded weights: no composition from them here
        self.icl_rows: list[tuple[int, float]] = []
        self._drop_rows_after(start_step)
        self.seconds = 0.0  # time spent here, to report the overhead
        if self.probes.roles is None:
            logger.write(f"attention monitor: block_size {model.config.block_size} is too short for the role "
                         f"probe (it needs 3 positions): duplicate_token and induction are nan")
        if cfg.attn.ablation != "off" and self.probes.ablation == "off":
            why = "under train.parallel=fsdp" if cfg.train.parallel == "fsdp" else "on a 1-token probe text"
            logger.write(f"attention monitor: ablation_dloss is not measured {why}; its column stays empty")

    # --- the CSV files across crashes and resumes -------------------------------------------------------

    def _drop_rows_after(self, step: int) -> None:
        """A resumed run redoes the steps after its checkpoint: forget their rows, keep one per (step, layer,
        head) in stats.csv and one per step in icl.csv. Rows that are not ours (a line cut short by a crash)
        are dropped too. A stats.csv of an older run with fewer columns is rewritten under today's header,
        its rows keeping their values and the new columns left empty. Each file is rewritten whole or not at
        all (temporary file, then a rename). Then the rows kept are what the picture starts from."""
        stats = self._kept_rows(self.stats_path, STATS_COLUMNS, step)
        icl = self._kept_rows(self.icl_path, ICL_COLUMNS, step)
        column = STATS_COLUMNS.index("induction")
        self.induction_rows = [(int(r[0]), int(r[1]), int(r[2]), _float(r[column])) for r in stats]
        source, z = STATS_COLUMNS.index("k_source"), STATS_COLUMNS.index("k_z")
        self.k_rows = [(int(r[0]), int(r[1]), int(r[2]), r[source], _float(r[z])) for r in stats]
        self.icl_rows = [(int(r[0]), _float(r[1])) for r in icl]

    def _kept_rows(self, path: Path, columns: tuple[str, ...], step: int) -> list[list[str]]:
        if not path.is_file():
            return []
        with could_not_write(path, self.out_dir):
            with open(path, newline="", encoding="utf-8", errors="replace") as f:
                rows = [row for row in csv.reader(line.replace("\0", "") for line in f)]
            header = rows[0] if rows else []
            if header[:1] == ["step"] and header != list(columns) and set(header) <= set(columns):
                # an older layout: its columns by name, today's missing ones empty
                where = [header.index(name) if name in header else None for name in columns]
                body = [[row[k] if k is not None else "" for k in where]
                        for row in rows[1:] if _row_step(row, len(header)) is not None]
            else:
                body = rows[1:]
            body = [r for r in body if _row_step(r, len(columns)) is not None and _row_step(r, len(columns)) <= step]
            kept = [list(columns)] + body
            if kept != rows:
                write_file(path, _csv_text(kept))
        return body

    def _append(self, path: Path, columns: tuple[str, ...], rows: list[list]) -> None:
        with could_not_write(path, self.out_dir):
            append_text(path, _csv_text(rows if path.is_file() else [list(columns), *rows]))

    # --- snapshots --------------------------------------------------------------------------------------

    def due(self, step: int) -> bool:
        return self.interval is not None and step % self.interval == 0

    def record_icl(self, step: int, icl_score: float) -> None:
        """An eval's val ICL score, for the picture (icl.csv)."""
        self._append(self.icl_path, ICL_COLUMNS, [[step, _cell(icl_score)]])
        self.icl_rows.append((step, icl_score))

    @torch.no_grad()
    def snapshot(self, step: int) -> None:
        t0 = time.perf_counter()
        # the maps, what the explorer needs (q, k, v, W_O), the role scores and the ablations: from-scratch
        # path, eval mode; the same passes on every process of an FSDP run (Probes)
        internals, roles, dloss = self.probes.run(self.model)
        maps = {layer: found.weights for layer, found in internals.items()}  # {layer: (1, n_head, T, T)}
        scalars: dict[str, object] = {}
        strongest = strongest_edges(composition_zscores(self.model), self.model.config.n_head) if self.circuit else []
        sources = sources_by_target(strongest)
        rows = []
        for layer, weights in maps.items():
            stats = head_stats(weights)
            for head in range(weights.shape[1]):
                values: dict[str, float | None] = {name: float(stats[name][head]) for name in STAT_NAMES}
                values.update({name: float(roles[name][layer, head]) for name in ROLE_NAMES})
                values["ablation_dloss"] = None if dloss is None else float(dloss[layer, head])
                edges = sources.get((layer, head), {})
                circuit = [cell for kind in COMPOSITION_KINDS
                           for cell in ((edges[kind][0], _cell(edges[kind][1])) if kind in edges else ("", ""))]
                rows.append([step, layer, head, *(_cell(values[name]) for name in values), *circuit])
                self.induction_rows.append((step, layer, head, values["induction"]))
                self.k_rows.append((step, layer, head, *edges.get("k", ("", math.nan))))
                for name, value in values.items():
                    if value is not None:
                        scalars[f"attn/L{layer}.H{head}/{name}"] = value
                for kind, (_, z) in edges.items():
                    scalars[f"attn/circuit/{kind}/{head_name(layer, head)}"] = z
        self._append(self.stats_path, STATS_COLUMNS, rows)
        images = self.draw(step, maps)
        if self.circuit:
            images["attn/circuit_picture"] = self.draw_circuit(step, strongest, roles)
        explorer = self.write_explorer(step, internals, {**roles, **({} if dloss is None else {"ablation_dloss": dloss})})
        if self.logger.wandb is not None:
            import wandb
            scalars.update({key: wandb.Image(str(png), caption=f"step {step}") for key, png in images.items()})
            scalars["attn/explorer"] = wandb.Html(str(explorer), inject=False)  # inject would add a remote stylesheet
            self.logger.log_wandb(step, scalars)
        self.seconds += time.perf_counter() - t0

    def draw(self, step: int, maps: dict[int, torch.Tensor]) -> dict[str, Path]:
        """The heatmaps and zooms of the drawn layers and the heads-over-training picture: {W&B key: PNG}."""
        images = {}
        for layer in self.layers_drawn:
            png = self.dir / f"layer_{layer}" / f"step_{step:06d}.png"
            with could_not_write(png, self.out_dir):
                png.parent.mkdir(exist_ok=True)
                self.maps_canvas.draw(maps[layer][0], f"layer {layer}, step {step}", png)
            images[f"attn/layer_{layer}"] = png
            if self.zoom_canvas is not None:
                zoom = png.with_name(f"step_{step:06d}_zoom.png")
                with could_not_write(zoom, self.out_dir):
                    self.zoom_canvas.draw(maps[layer][0], f"layer {layer}, step {step}", zoom)
                images[f"attn/layer_{layer}_zoom"] = zoom
        with could_not_write(self.picture_path, self.out_dir):
            draw_heads_over_training(self.induction_rows, self.icl_rows, path=self.picture_path,
                                     title=f"induction score per head (layer.head), up to step {step}")
        images["attn/heads_over_training"] = self.picture_path
        return images

    def draw_circuit(self, step: int, edges: list, roles: dict[str, np.ndarray]) -> Path:
        """The circuit picture of this snapshot (insight/circuit_plot.py), each head's strongest source per kind,
        the heads labelled with their roles, as `attn/circuit/step_{S}.png`."""
        png = self.dir / "circuit" / f"step_{step:06d}.png"
        n_layer, n_head = self.model.config.n_layer, self.model.config.n_head
        labels = {(layer, head): role_label(*(float(roles[name][layer, head]) for name in ROLE_NAMES))
                  for layer in range(n_layer) for head in range(n_head)}
        with could_not_write(png, self.out_dir):
            png.parent.mkdir(exist_ok=True)
            draw_circuit(edges, n_layer, n_head, labels, path=png, title=f"strongest composition sources, step {step}")
        return png

    def write_explorer(self, step: int, internals: dict, head_scores: dict[str, np.ndarray]) -> Path:
        """The explorer of every layer and head over the probe, as `attn/explorer/step_{S}.html`, its
        Statistics tab with the snapshot's head scores ({name: (n_layer, n_head)})."""
        path = self.dir / "explorer" / f"step_{step:06d}.html"
        path.parent.mkdir(exist_ok=True)
        ablation = ("; ablation Δloss not measured (attn.ablation=off or FSDP)" if "ablation_dloss" not in head_scores
                    else f"; ablation Δloss over the probe text, each head {self.probes.ablation}-ablated")
        note = (f"step {step}: prev_token over the probe text's {len(self.probes.ids)} tokens; duplicate_token and "
                f"induction on the role probe ({self.probes.role_note}){ablation}")
        options = ExplorerOptions(title=f"attention at step {step}", info=f"step {step}", max_bytes=EXPLORER_MAX_BYTES)
        return write_explorer(path, internals, self.tokens, options=options, scores=HeadScores(head_scores, note))

    def summary(self) -> str:
        """The run's induction heads and phase change, in one line (insight.role_plot.induction_summary), and
        when an induction head formed, its circuit: the strongest induction head's strongest K-composer at the
        last snapshot, that edge's z, the change of the head's induction score when that source is path-ablated
        from its key input (on the model's weights now, the run's last), and the step from which that source
        stays the strongest (formed_at)."""
        text = induction_summary(self.induction_rows, self.icl_rows)
        heads = induction_heads(head_series(self.induction_rows)[1]) if self.induction_rows else []
        if not heads or not self.circuit:
            return text
        target = heads[0][:2]
        mine = [row for row in self.k_rows if row[1:3] == target]
        if not mine or not mine[-1][3]:
            return text
        last = max(row[0] for row in mine)
        source, z = [row[3:] for row in mine if row[0] == last][-1]
        t0 = time.perf_counter()
        drop = None
        if self.probes.roles is not None:
            la, a = (int(part[1:]) for part in source.split("."))
            drop = float(path_ablation(self.model, self.probes.text, self.probes.roles, "k", target,
                                       [(la, a)])["induction"][0])
        self.seconds += time.perf_counter() - t0
        formed = formed_at([row[:4] for row in self.k_rows], target, source)
        return f"{text}; {circuit_text(source, target, z, drop, formed)}"


def _csv_text(rows: list[list]) -> str:
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(rows)
    return out.getvalue()
