/**
 * Pure DOM building for saved xmem reports (`application/vnd.xmem.report+json`).
 *
 * Nothing here imports JupyterLab: every function takes the `Document` to build in, so the
 * unit tests run it under jsdom. The data comes from notebooks, which may be untrusted:
 * text is only ever set with `textContent`, attributes only with values computed here
 * (numbers, fixed class names), and no HTML string from the data is ever parsed.
 * (test/safety.test.ts checks the source for the HTML-parsing APIs.)
 *
 * The format is documented by `xmem_engine/data/report.schema.json` (version 1) and is
 * written by `Estimate.to_report()` in `xmem_engine/estimate.py`.
 */

import { Advice, parseAdvice, renderAdvice } from './advice';
import { el, formatBytes, formatGiB, isNum, isObject, str } from './format';
export { fixed2, formatBytes, formatGiB } from './format';

export const REPORT_MIME = 'application/vnd.xmem.report+json';
export const SUPPORTED_VERSION = 1;

const SVG_NS = 'http://www.w3.org/2000/svg';

export interface TopTensor {
  bytes: number;
  requested?: number;
  category?: string;
  op?: string;
  module?: string;
  phase?: string;
  shape?: number[];
  dtype?: string;
  source?: string;
}

export interface ReportTimeline {
  event: number[];
  allocated: number[];
  reserved: number[];
  phases: Array<[number, string]>;
  iterations: number[];
  peak_event: number;
}

/** Version 1 of the report, as the renderer reads it (after `parseReport`). */
export interface Report {
  version: number;
  gpu: string;
  gpu_name: string;
  capacity_bytes: number;
  context_bytes: number;
  outside_allocator_bytes: number;
  peak_allocated_bytes: number;
  peak_reserved_bytes: number;
  peak_device_bytes: number;
  fits: boolean;
  headroom_bytes: number;
  oom: boolean;
  /** The verdict sentence as xmem wrote it (absent in reports of older xmem versions). */
  headline?: string;
  /** What the peak is made of, as xmem wrote it. */
  headline_detail?: string;
  reserved_at_peak_bytes?: number;
  mode?: string;
  seconds?: number;
  n_events?: number;
  alloc_conf?: string;
  torch_version?: string;
  breakdown: Record<string, number>;
  breakdown_by_module: Record<string, number>;
  top_tensors: TopTensor[];
  notes: string[];
  timeline: ReportTimeline | null;
  /** The calibrated range of the peak device memory, and the range in xmem's words. */
  peak_device_bytes_low?: number;
  peak_device_bytes_high?: number;
  range?: string;
  /** What would make it fit: each lever measured on the step (absent unless it was asked for). */
  advice: Advice | null;
  /** Each named figure as xmem computed and named it (xmem_jupyter/figures.py). */
  figures: Figures;
  /** The tensor-lifetime flame chart, or null (reports of older xmem versions). */
  flame: ReportFlame | null;
  /** CSS custom properties (name -> #rrggbb) from the report's `palette`: the widget's colours. */
  palette: Array<[string, string]>;
}

/** One named quantity: the same name and number in every view. */
export interface Figure {
  name: string;
  bytes: number;
  about: string;
}

export interface Figures {
  items: Record<string, Figure>;
  /** The device bar's parts, in order (they add up to the device peak). */
  split: string[];
  /** The device peak in words. */
  text: string;
  /** The peak as nvidia-smi and as NVML v1's total - free read it ('' in older reports). */
  readings: string;
  /** The first step's peak beside the steady state's ('' for one step, or in older reports). */
  steady: string;
}

/** The flame chart as the report carries it (xmem_jupyter/flame.py, `flame_report`). */
export interface ReportFlame {
  unit: string;
  x_end: number;
  n_tensors: number;
  categories: string[];
  left: number[];
  right: number[];
  bottom: number[];
  top: number[];
  cat: number[];
  label: number[];
  labels: string[];
  peak_event: number;
  notes: string[];
}

export type ParseResult =
  | { ok: true; report: Report }
  | { ok: false; kind: 'version' | 'invalid'; message: string };

// ---------------------------------------------------------------------------------------
// Formatting

function formatPercent(part: number, whole: number): string {
  if (!(whole > 0)) {
    return '';
  }
  const p = (100 * part) / whole;
  return p > 0 && p < 0.1 ? '<0.1%' : `${p.toFixed(1)}%`;
}

/**
 * The verdict sentence. xmem writes it once (`Estimate.headline`, in Python) and carries it
 * in the report, so the CLI, the widget and this renderer show the same words; a report
 * saved by an older xmem, which lacks it, gets the bare verdict.
 */
export function headlineText(r: Report): string {
  return r.headline ?? `${r.gpu_name}: ${r.fits ? 'fits' : 'does not fit'}`;
}

/** What the device peak is made of, in the words of xmem_jupyter/figures.py. */
export function splitText(r: Report): string {
  return r.figures.text;
}

/** A figure's name and amount, as every view prints it ("allocated peak 16.09 GiB"). */
export function figureText(r: Report, key: string): string {
  const f = r.figures.items[key];
  return f ? `${f.name} ${formatGiB(f.bytes)}` : '';
}

/**
 * The figures the report carries (`figures`, written by xmem_jupyter/figures.py); a report
 * of an older xmem, which lacks them, gets the same names and sums from its fields.
 */
export function parseFigures(v: unknown, data: Record<string, number>): Figures {
  const items: Record<string, Figure> = {};
  let split: string[] = [];
  let text = '';
  let readings = '';
  let steady = '';
  if (isObject(v) && isObject(v.items)) {
    for (const [k, f] of Object.entries(v.items)) {
      if (isObject(f) && isNum(f.bytes)) {
        items[k] = { name: str(f.name, k), bytes: f.bytes, about: str(f.about) };
      }
    }
    if (Array.isArray(v.split)) {
      split = v.split.map(x => str(x)).filter(k => k in items);
    }
    text = str(v.text);
    readings = str(v.readings);
    steady = str(v.steady);
  }
  if (!split.length) {
    const reservedAbove = Math.max(0, data.peak_reserved_bytes - data.peak_allocated_bytes);
    const fallback: Array<[string, string, number, string]> = [
      ['device_peak', 'peak device memory', data.peak_device_bytes, 'CUDA context + libraries + the reserved peak'],
      ['capacity', 'GPU capacity', data.capacity_bytes, 'the memory the driver lets a process use'],
      ['allocator_limit', 'allocator limit', Math.max(0, data.capacity_bytes - data.context_bytes - data.outside_allocator_bytes),
        'what PyTorch\'s allocator may reserve: capacity - CUDA context - libraries'],
      ['context', 'CUDA context', data.context_bytes, 'the CUDA context of the process'],
      ['libraries', 'libraries', data.outside_allocator_bytes, 'kernels of PyTorch, cuBLAS and cuDNN, outside PyTorch\'s allocator'],
      ['reserved_peak', 'reserved peak', data.peak_reserved_bytes, 'the most PyTorch\'s allocator reserves from the GPU during the step'],
      ['allocated_peak', 'allocated peak', data.peak_allocated_bytes, 'the most the tensors hold at once'],
      ['reserved_above', 'reserved above the allocated peak', reservedAbove, 'reserved peak - allocated peak: cached blocks and fragmentation']
    ];
    for (const [k, name, bytes, about] of fallback) {
      if (!(k in items)) {
        items[k] = { name, bytes, about };
      }
    }
    split = ['context', 'libraries', 'allocated_peak', 'reserved_above'];
  }
  if (!text) {
    // as xmem_jupyter/figures.py words it (`split_text`); never the older `headline_detail`,
    // whose "allocated ... at the peak" named the allocated peak as if it were the device's
    const t = (k: string): string => `${items[k].name} ${formatGiB(items[k].bytes)}`;
    text = `${t('device_peak')} = ${t('context')} + ${t('libraries')} + ${t('reserved_peak')} ` +
      `(${t('allocated_peak')} + ${t('reserved_above')}: cached blocks and fragmentation)`;
  }
  return { items, split, text, readings, steady };
}

function parseFlame(v: unknown): ReportFlame | null {
  if (!isObject(v)) {
    return null;
  }
  const cols = ['left', 'right', 'bottom', 'top', 'cat', 'label'].map(k => numArray(v[k]));
  if (cols.some(c => c === null) || !isNum(v.x_end)) {
    return null;
  }
  const [left, right, bottom, top, cat, label] = cols as number[][];
  const n = Math.min(left.length, right.length, bottom.length, top.length, cat.length, label.length);
  return {
    unit: str(v.unit, 'GiB'),
    x_end: v.x_end as number,
    n_tensors: isNum(v.n_tensors) ? v.n_tensors : 0,
    categories: Array.isArray(v.categories) ? v.categories.map(c => str(c)) : [],
    left: left.slice(0, n),
    right: right.slice(0, n),
    bottom: bottom.slice(0, n),
    top: top.slice(0, n),
    cat: cat.slice(0, n),
    label: label.slice(0, n),
    labels: Array.isArray(v.labels) ? v.labels.map(t => str(t)) : [],
    peak_event: isNum(v.peak_event) ? v.peak_event : -1,
    notes: Array.isArray(v.notes) ? v.notes.map(t => str(t)) : []
  };
}

// ---------------------------------------------------------------------------------------
// Parsing: never trust the shape of the data

function numArray(v: unknown): number[] | null {
  if (!Array.isArray(v) || !v.every(isNum)) {
    return null;
  }
  return v as number[];
}

function byteMap(v: unknown): Record<string, number> {
  const out: Record<string, number> = {};
  if (isObject(v)) {
    for (const [k, n] of Object.entries(v)) {
      if (isNum(n)) {
        out[k] = n;
      }
    }
  }
  return out;
}

function parseTimeline(v: unknown): ReportTimeline | null {
  if (!isObject(v)) {
    return null;
  }
  const event = numArray(v.event);
  const allocated = numArray(v.allocated);
  const reserved = numArray(v.reserved);
  if (!event || !allocated || !reserved) {
    return null;
  }
  const n = Math.min(event.length, allocated.length, reserved.length);
  if (n === 0) {
    return null;
  }
  const phases: Array<[number, string]> = [];
  if (Array.isArray(v.phases)) {
    for (const p of v.phases) {
      if (Array.isArray(p) && isNum(p[0])) {
        phases.push([p[0], str(p[1])]);
      }
    }
  }
  return {
    event: event.slice(0, n),
    allocated: allocated.slice(0, n),
    reserved: reserved.slice(0, n),
    phases,
    iterations: numArray(v.iterations) ?? [],
    peak_event: isNum(v.peak_event) ? v.peak_event : -1
  };
}

const REQUIRED_NUMBERS = [
  'capacity_bytes',
  'context_bytes',
  'outside_allocator_bytes',
  'peak_allocated_bytes',
  'peak_reserved_bytes',
  'peak_device_bytes',
  'headroom_bytes'
] as const;

/** Check a report's version and the fields the renderer needs; never throws. */
export function parseReport(data: unknown): ParseResult {
  if (typeof data === 'string') {
    try {
      data = JSON.parse(data);
    } catch {
      return { ok: false, kind: 'invalid', message: 'This xmem report is not valid JSON.' };
    }
  }
  if (!isObject(data)) {
    return { ok: false, kind: 'invalid', message: 'This output is not an xmem report (expected a JSON object).' };
  }
  const version = data.version;
  if (version !== SUPPORTED_VERSION) {
    let message: string;
    if (version === undefined || version === null) {
      message = 'This output has no report format version, so this viewer cannot read it as an xmem report.';
    } else {
      const shown = String(version).slice(0, 40);
      const advice =
        isNum(version) && version > SUPPORTED_VERSION
          ? 'It was written by a newer xmem: update xmem (pip install -U xmem) and reload, or re-run the cell.'
          : 'Re-run the cell with this xmem to see the estimate.';
      message = `This xmem report has format version ${shown}; this viewer reads version ${SUPPORTED_VERSION}. ${advice}`;
    }
    return { ok: false, kind: 'version', message };
  }
  const missing: string[] = [];
  for (const k of REQUIRED_NUMBERS) {
    if (!isNum(data[k])) {
      missing.push(k);
    }
  }
  if (typeof data.fits !== 'boolean') {
    missing.push('fits');
  }
  if (missing.length) {
    return {
      ok: false,
      kind: 'invalid',
      message: `This xmem report (version ${SUPPORTED_VERSION}) is incomplete: missing or invalid ${missing.join(', ')}.`
    };
  }
  const num = (k: string): number => data[k] as number;
  const optNum = (k: string): number | undefined => (isNum(data[k]) ? (data[k] as number) : undefined);
  const optStr = (k: string): string | undefined => (data[k] === undefined ? undefined : str(data[k]));
  const tensors: TopTensor[] = [];
  if (Array.isArray(data.top_tensors)) {
    for (const t of data.top_tensors) {
      if (isObject(t) && isNum(t.bytes)) {
        tensors.push({
          bytes: t.bytes,
          requested: isNum(t.requested) ? t.requested : undefined,
          category: str(t.category),
          op: str(t.op),
          module: str(t.module),
          phase: str(t.phase),
          shape: numArray(t.shape) ?? undefined,
          dtype: str(t.dtype),
          source: str(t.source)
        });
      }
    }
  }
  const report: Report = {
    version: SUPPORTED_VERSION,
    gpu: str(data.gpu),
    gpu_name: str(data.gpu_name) || str(data.gpu) || 'an unnamed GPU',
    capacity_bytes: num('capacity_bytes'),
    context_bytes: num('context_bytes'),
    outside_allocator_bytes: num('outside_allocator_bytes'),
    peak_allocated_bytes: num('peak_allocated_bytes'),
    peak_reserved_bytes: num('peak_reserved_bytes'),
    peak_device_bytes: num('peak_device_bytes'),
    fits: data.fits as boolean,
    headroom_bytes: num('headroom_bytes'),
    oom: data.oom === true,
    headline: typeof data.headline === 'string' ? data.headline : undefined,
    headline_detail: typeof data.headline_detail === 'string' ? data.headline_detail : undefined,
    reserved_at_peak_bytes: optNum('reserved_at_peak_bytes'),
    mode: optStr('mode'),
    seconds: optNum('seconds'),
    n_events: optNum('n_events'),
    alloc_conf: optStr('alloc_conf'),
    torch_version: optStr('torch_version'),
    breakdown: byteMap(data.breakdown),
    breakdown_by_module: byteMap(data.breakdown_by_module),
    top_tensors: tensors,
    notes: Array.isArray(data.notes) ? data.notes.map(n => str(n)) : [],
    timeline: parseTimeline(data.timeline),
    peak_device_bytes_low: optNum('peak_device_bytes_low'),
    peak_device_bytes_high: optNum('peak_device_bytes_high'),
    range: optStr('range'),
    advice: parseAdvice(data.advice),
    palette: parsePalette(data.palette),
    figures: parseFigures(data.figures, data as Record<string, number>),
    flame: parseFlame(data.flame)
  };
  return { ok: true, report };
}

const HEX_COLOUR = /^#[0-9a-fA-F]{6}$/;

/**
 * The report's `palette` (xmem_jupyter/palette.py) as CSS custom properties the stylesheet
 * reads: the fills (categories, phases, the device bar) and the reserved line. Only known names
 * and `#rrggbb` values pass: nothing else from the data reaches CSS.
 */
export function parsePalette(value: unknown): Array<[string, string]> {
  const out: Array<[string, string]> = [];
  if (!value || typeof value !== 'object' || Array.isArray(value)) {
    return out;
  }
  const groups = value as Record<string, unknown>;
  const take = (group: string, names: string[], variable: (name: string) => string): void => {
    const g = groups[group];
    if (!g || typeof g !== 'object' || Array.isArray(g)) {
      return;
    }
    for (const name of names) {
      const c = (g as Record<string, unknown>)[name];
      if (typeof c === 'string' && HEX_COLOUR.test(c)) {
        out.push([variable(name), c]);
      }
    }
  };
  take('categories', KNOWN_CATEGORIES, name => `--xmem-c${KNOWN_CATEGORIES.indexOf(name)}`);
  take('phases', ['forward', 'backward', 'optimizer'], name => `--xmem-phase-${name}`);
  take('device', ['context', 'libraries', 'allocated', 'cached'], name => `--xmem-dev-${name}`);
  // text and thin marks (verdict, capacity, limit, peak, allocated) take the theme's shade from
  // the extension's stylesheet (style/palette.css, from xmem_jupyter/palette.py), not from here
  take('lines', ['reserved'], name => `--xmem-line-${name}`);
  return out;
}

// ---------------------------------------------------------------------------------------
// DOM helpers (textContent only)

function svgEl<K extends keyof SVGElementTagNameMap>(
  doc: Document,
  tag: K,
  attrs: Record<string, string | number> = {},
  className?: string
): SVGElementTagNameMap[K] {
  const node = doc.createElementNS(SVG_NS, tag) as SVGElementTagNameMap[K];
  for (const [k, v] of Object.entries(attrs)) {
    node.setAttribute(k, String(v));
  }
  if (className) {
    node.setAttribute('class', className);
  }
  return node;
}

function svgText(doc: Document, x: number, y: number, text: string, className: string, anchor = 'start'): SVGTextElement {
  const t = svgEl(doc, 'text', { x: round(x), y: round(y), 'text-anchor': anchor }, className);
  t.textContent = text;
  return t;
}

function svgTitle(doc: Document, text: string): SVGTitleElement {
  const t = svgEl(doc, 'title');
  t.textContent = text;
  return t;
}

function maxOf(xs: number[]): number {
  let m = -Infinity;
  for (const x of xs) {
    if (x > m) {
      m = x;
    }
  }
  return m;
}

function round(v: number): number {
  return Math.round(v * 10) / 10;
}

// Category colours: known categories keep their colour in every report; others take the
// next free slot. Colours themselves live in the stylesheet (theme variables).
const KNOWN_CATEGORIES = [
  'parameter',
  'gradient',
  'optimizer_state',
  'activation',
  'temporary',
  'workspace',
  'input',
  'buffer',
  'other'
];
const N_COLOURS = 10;

function categoryClasses(categories: string[]): Map<string, string> {
  const out = new Map<string, string>();
  let next = KNOWN_CATEGORIES.length;
  for (const c of categories) {
    const known = KNOWN_CATEGORIES.indexOf(c);
    const slot = known >= 0 ? known : next++ % N_COLOURS;
    out.set(c, `xmem-c${slot % N_COLOURS}`);
  }
  return out;
}

const PHASE_CLASSES: Record<string, string> = {
  forward: 'xmem-phase-forward',
  backward: 'xmem-phase-backward',
  optimizer: 'xmem-phase-optimizer'
};

// ---------------------------------------------------------------------------------------
// Sections

/** The device bar: context | libraries | allocated | cached | free, against capacity. */
const SEGMENT_CLASSES: Record<string, string> = {
  context: 'xmem-seg-context',
  libraries: 'xmem-seg-libraries',
  allocated_peak: 'xmem-seg-allocated',
  reserved_above: 'xmem-seg-cached'
};

/**
 * The device bar: the device peak's parts (the report's `figures.split`: context, libraries,
 * allocated peak, reserved above it) and the headroom, against the capacity; each part named
 * and measured as the widget names and measures it.
 */
export function renderDeviceBar(r: Report, doc: Document): HTMLElement {
  const wrap = el(doc, 'div', 'xmem-devicebar');
  const parts: Array<[string, string, number, string]> = r.figures.split.map(k => {
    const f = r.figures.items[k];
    return [SEGMENT_CLASSES[k] ?? 'xmem-seg-cached', f.name, f.bytes, f.about];
  });
  parts.push(['xmem-seg-free', 'headroom', Math.max(0, r.capacity_bytes - r.peak_device_bytes),
    'what is left of the GPU at the peak']);
  const total = Math.max(r.capacity_bytes, r.peak_device_bytes) || 1;
  const bar = el(doc, 'div', 'xmem-bar');
  bar.setAttribute('role', 'img');
  bar.setAttribute('aria-label', `${splitText(r)}; GPU capacity ${formatGiB(r.capacity_bytes)}`);
  const legend = el(doc, 'div', 'xmem-legend');
  for (const [cls, label, bytes, about] of parts) {
    if (bytes <= 0) {
      continue;
    }
    const seg = el(doc, 'div', `xmem-seg ${cls}`);
    seg.style.width = `${((100 * bytes) / total).toFixed(3)}%`;
    seg.title = `${label} ${formatGiB(bytes)}` + (about ? `: ${about}` : '');
    bar.appendChild(seg);
    const item = el(doc, 'span', 'xmem-legend-item');
    item.appendChild(el(doc, 'span', `xmem-swatch ${cls}`));
    item.appendChild(doc.createTextNode(`${label} ${formatGiB(bytes)}`));
    legend.appendChild(item);
  }
  if (r.peak_device_bytes > r.capacity_bytes) {
    const cap = el(doc, 'div', 'xmem-bar-capacity');
    cap.style.left = `${((100 * r.capacity_bytes) / total).toFixed(3)}%`;
    cap.title = figureText(r, 'capacity') || `GPU capacity ${formatGiB(r.capacity_bytes)}`;
    bar.appendChild(cap);
  }
  wrap.appendChild(bar);
  wrap.appendChild(legend);
  return wrap;
}

/** What is live at the peak, by category: a stacked bar and a table. */
export function renderBreakdown(r: Report, doc: Document): HTMLElement {
  const section = el(doc, 'div', 'xmem-section xmem-breakdown');
  section.appendChild(el(doc, 'div', 'xmem-section-title', 'Live at the allocated peak, by kind'));
  const entries = Object.entries(r.breakdown).sort((a, b) => b[1] - a[1]);
  if (!entries.length) {
    section.appendChild(el(doc, 'div', 'xmem-empty', 'No breakdown in this report.'));
    return section;
  }
  const total = entries.reduce((s, [, v]) => s + v, 0) || 1;
  const classes = categoryClasses(entries.map(([k]) => k));
  const bar = el(doc, 'div', 'xmem-bar xmem-breakdown-bar');
  for (const [k, v] of entries) {
    const seg = el(doc, 'div', `xmem-seg ${classes.get(k)}`);
    seg.style.width = `${((100 * v) / total).toFixed(3)}%`;
    seg.title = `${k}: ${formatBytes(v)}`;
    bar.appendChild(seg);
  }
  section.appendChild(bar);
  const table = el(doc, 'table', 'xmem-table');
  const head = table.createTHead().insertRow();
  for (const h of ['kind', 'size', 'share']) {
    head.appendChild(el(doc, 'th', undefined, h));
  }
  const body = table.createTBody();
  for (const [k, v] of entries) {
    const row = body.insertRow();
    const name = row.insertCell();
    name.appendChild(el(doc, 'span', `xmem-swatch ${classes.get(k)}`));
    name.appendChild(doc.createTextNode(k));
    row.insertCell().textContent = formatBytes(v);
    row.insertCell().textContent = formatPercent(v, total);
    row.cells[1].className = 'xmem-num';
    row.cells[2].className = 'xmem-num';
  }
  section.appendChild(table);
  return section;
}

/** The largest modules at the peak. */
export function renderModules(r: Report, doc: Document): HTMLElement | null {
  const entries = Object.entries(r.breakdown_by_module).sort((a, b) => b[1] - a[1]);
  if (!entries.length) {
    return null;
  }
  const section = el(doc, 'div', 'xmem-section xmem-modules');
  section.appendChild(el(doc, 'div', 'xmem-section-title', 'Live at the allocated peak, by module'));
  const table = el(doc, 'table', 'xmem-table');
  const head = table.createTHead().insertRow();
  for (const h of ['module', 'size']) {
    head.appendChild(el(doc, 'th', undefined, h));
  }
  const body = table.createTBody();
  for (const [k, v] of entries) {
    const row = body.insertRow();
    row.insertCell().textContent = k;
    const c = row.insertCell();
    c.textContent = formatBytes(v);
    c.className = 'xmem-num';
  }
  section.appendChild(table);
  return section;
}

/** The largest tensors live at the peak. */
export function renderTopTensors(r: Report, doc: Document): HTMLElement | null {
  if (!r.top_tensors.length) {
    return null;
  }
  const details = el(doc, 'details', 'xmem-section xmem-tensors');
  details.appendChild(el(doc, 'summary', 'xmem-section-title', `Largest tensors live at the allocated peak (${r.top_tensors.length})`));
  const table = el(doc, 'table', 'xmem-table');
  const head = table.createTHead().insertRow();
  for (const h of ['size', 'kind', 'shape', 'dtype', 'module', 'op', 'phase', 'source']) {
    head.appendChild(el(doc, 'th', undefined, h));
  }
  const body = table.createTBody();
  for (const t of r.top_tensors) {
    const row = body.insertRow();
    const cells = [
      formatBytes(t.bytes),
      t.category ?? '',
      t.shape ? `[${t.shape.join(', ')}]` : '',
      t.dtype ?? '',
      t.module ?? '',
      t.op ?? '',
      t.phase ?? '',
      t.source ?? ''
    ];
    cells.forEach((text, i) => {
      const c = row.insertCell();
      c.textContent = text;
      if (i === 0) {
        c.className = 'xmem-num';
      }
    });
  }
  const scroll = el(doc, 'div', 'xmem-scroll');
  scroll.appendChild(table);
  details.appendChild(scroll);
  return details;
}

function niceStep(max: number, ticks: number): number {
  const raw = max / ticks;
  // Binary-friendly steps: powers of two times 1, 2 or 5 of a binary unit.
  const unit = 1024 ** Math.max(0, Math.floor(Math.log(Math.max(raw, 1)) / Math.log(1024)));
  const scaled = raw / unit;
  const pow = 10 ** Math.floor(Math.log10(Math.max(scaled, 1e-9)));
  const m = scaled / pow;
  const nice = m <= 1 ? 1 : m <= 2 ? 2 : m <= 2.5 ? 2.5 : m <= 5 ? 5 : 10;
  return nice * pow * unit;
}

export interface TimelineGeometry {
  width: number;
  height: number;
  left: number;
  right: number;
  top: number;
  bottom: number;
  xMax: number;
  yMax: number;
  limit: number;
  limitOnChart: boolean;
  capacity: number;
  capacityOnChart: boolean;
}

/** The x axis both charts share (the flame chart's bars line up with the timeline's events). */
export const CHART_BOX = { width: 720, left: 74, right: 16 };

/**
 * Axis ranges: the GPU's capacity and the limit the allocator may reserve (capacity - context
 * - libraries) are drawn when within reach of the lines.
 */
export function timelineGeometry(r: Report, tl: ReportTimeline): TimelineGeometry {
  const limit = Math.max(0, r.capacity_bytes - r.context_bytes - r.outside_allocator_bytes);
  const capacity = r.capacity_bytes;
  const band = (r.peak_device_bytes_high ?? 0) - r.context_bytes - r.outside_allocator_bytes;
  const top = Math.max(maxOf(tl.reserved), maxOf(tl.allocated), band, 1);
  const limitOnChart = limit <= top * 4;
  const capacityOnChart = capacity <= top * 4;
  const yMax = Math.max(top, limitOnChart ? limit : 0, capacityOnChart ? capacity : 0) * 1.08;
  const xMax = Math.max(tl.event[tl.event.length - 1], (r.n_events ?? 0) - 1, 1);
  return { ...CHART_BOX, height: 240, top: 22, bottom: 34, xMax, yMax, limit, limitOnChart, capacity, capacityOnChart };
}

/** Index of the first sample where reserved memory is highest. */
export function reservedPeakIndex(tl: ReportTimeline): number {
  let best = 0;
  for (let i = 1; i < tl.reserved.length; i++) {
    if (tl.reserved[i] > tl.reserved[best]) {
      best = i;
    }
  }
  return best;
}

/** A label's box in the chart's coordinates (11px text: about 6.2px a character). */
interface Box {
  x0: number;
  x1: number;
  y0: number;
  y1: number;
}

function labelBox(x: number, y: number, text: string, anchor: string): Box {
  const w = text.length * 6.2;
  const x0 = anchor === 'end' ? x - w : x;
  return { x0, x1: x0 + w, y0: y - 11, y1: y + 3 };
}

export function overlaps(a: Box, b: Box): boolean {
  return a.x0 < b.x1 && b.x0 < a.x1 && a.y0 < b.y1 && b.y0 < a.y1;
}

/** Index of the peak sample: the saved peak event if present, else the highest allocated. */
export function peakIndex(tl: ReportTimeline): number {
  let best = 0;
  for (let i = 1; i < tl.allocated.length; i++) {
    if (tl.allocated[i] > tl.allocated[best]) {
      best = i;
    }
  }
  const saved = tl.event.indexOf(tl.peak_event);
  return saved >= 0 && tl.allocated[saved] >= tl.allocated[best] ? saved : best;
}

/** Index of the sample whose event is nearest to `e` (events increase). */
export function nearestSample(events: number[], e: number): number {
  let lo = 0;
  let hi = events.length - 1;
  while (hi - lo > 1) {
    const mid = (lo + hi) >> 1;
    if (events[mid] <= e) {
      lo = mid;
    } else {
      hi = mid;
    }
  }
  return Math.abs(events[hi] - e) < Math.abs(events[lo] - e) ? hi : lo;
}

function stepPoints(xs: number[], ys: number[]): string {
  const pts: string[] = [];
  for (let i = 0; i < xs.length; i++) {
    if (i > 0) {
      pts.push(`${round(xs[i])},${round(ys[i - 1])}`);
    }
    pts.push(`${round(xs[i])},${round(ys[i])}`);
  }
  return pts.join(' ');
}

/**
 * The memory timeline: reserved and allocated over the events, the GPU's capacity (solid) and
 * the allocator's limit (dashed, another colour), the allocated peak and the reserved peak,
 * each labelled with the name and figure every view gives it (labels never overlap).
 */
export function renderTimeline(r: Report, doc: Document): HTMLElement {
  const section = el(doc, 'div', 'xmem-section xmem-timeline');
  section.appendChild(el(doc, 'div', 'xmem-section-title', 'Memory over the step (PyTorch allocator)'));
  const tl = r.timeline;
  if (!tl) {
    section.appendChild(el(doc, 'div', 'xmem-empty', 'No timeline in this report.'));
    return section;
  }
  const g = timelineGeometry(r, tl);
  const pw = g.width - g.left - g.right;
  const ph = g.height - g.top - g.bottom;
  const X = (e: number): number => g.left + (pw * e) / g.xMax;
  const Y = (b: number): number => g.top + ph - (ph * b) / g.yMax;
  const pi = peakIndex(tl);
  const ri = reservedPeakIndex(tl);
  const allocatedText = figureText(r, 'allocated_peak') || `allocated peak ${formatGiB(tl.allocated[pi])}`;
  const reservedText = figureText(r, 'reserved_peak') || `reserved peak ${formatGiB(tl.reserved[ri])}`;
  const limitText = figureText(r, 'allocator_limit') || `allocator limit ${formatGiB(g.limit)}`;
  const capacityText = figureText(r, 'capacity') || `GPU capacity ${formatGiB(g.capacity)}`;

  const summary =
    `Memory timeline: ${allocatedText} at event ${tl.event[pi]}, ${reservedText} at event ${tl.event[ri]}; ` +
    `${capacityText}; ${limitText}` + (r.oom ? '; the run on this GPU runs out of memory' : '');
  const svg = svgEl(doc, 'svg', { viewBox: `0 0 ${g.width} ${g.height}`, width: '100%', role: 'img', 'aria-label': summary },
    'xmem-chart xmem-timeline-chart');
  svg.appendChild(svgTitle(doc, 'Allocated and reserved memory over the training step'));
  svg.appendChild(svgEl(doc, 'rect', { x: g.left, y: g.top, width: pw, height: ph }, 'xmem-plot-bg'));

  // Phase bands.
  const phases = tl.phases.filter(p => p[0] <= g.xMax);
  phases.forEach(([start, name], i) => {
    const end = i + 1 < phases.length ? phases[i + 1][0] : g.xMax;
    const cls = PHASE_CLASSES[name];
    if (!cls || end <= start) {
      return;
    }
    const band = svgEl(doc, 'rect', { x: round(X(start)), y: g.top, width: round(X(end) - X(start)), height: ph }, `xmem-phase ${cls}`);
    band.appendChild(svgTitle(doc, `${name}: events ${start}–${end}`));
    svg.appendChild(band);
  });

  // Grid and y ticks.
  const step = niceStep(g.yMax, 4);
  for (let v = 0; v <= g.yMax + 1e-9; v += step) {
    svg.appendChild(svgEl(doc, 'line', { x1: g.left, x2: g.left + pw, y1: round(Y(v)), y2: round(Y(v)) }, 'xmem-grid'));
    svg.appendChild(svgText(doc, g.left - 6, Y(v) + 4, formatBytes(v), 'xmem-tick', 'end'));
  }
  svg.appendChild(svgText(doc, g.left, g.height - 8, '0', 'xmem-tick', 'start'));
  svg.appendChild(svgText(doc, g.left + pw, g.height - 8, String(Math.round(g.xMax)), 'xmem-tick', 'end'));
  svg.appendChild(svgText(doc, g.left + pw / 2, g.height - 8, 'allocation / free events', 'xmem-axis-label', 'middle'));

  // Iteration starts.
  tl.iterations.forEach((e, i) => {
    if (e > g.xMax) {
      return;
    }
    const line = svgEl(doc, 'line', { x1: round(X(e)), x2: round(X(e)), y1: g.top, y2: g.top + ph }, 'xmem-iteration');
    line.appendChild(svgTitle(doc, `iteration ${i + 1} starts (event ${e})`));
    svg.appendChild(line);
  });

  // The GPU's capacity and the limit the allocator may reserve (capacity - context - libraries).
  if (g.capacityOnChart) {
    const y = round(Y(g.capacity));
    const line = svgEl(doc, 'line', { x1: g.left, x2: g.left + pw, y1: y, y2: y }, 'xmem-line-gpu');
    line.appendChild(svgTitle(doc, capacityText));
    svg.appendChild(line);
  }
  if (g.limitOnChart) {
    const y = round(Y(g.limit));
    const line = svgEl(doc, 'line', { x1: g.left, x2: g.left + pw, y1: y, y2: y }, 'xmem-line-capacity');
    line.appendChild(svgTitle(doc, `${limitText} (GPU capacity − CUDA context − libraries)`));
    svg.appendChild(line);
  }

  // The calibrated range of the reserved peak: the device range less context and libraries.
  if (r.peak_device_bytes_low !== undefined && r.peak_device_bytes_high !== undefined) {
    const fixed = r.context_bytes + r.outside_allocator_bytes;
    const lo = Math.max(0, r.peak_device_bytes_low - fixed);
    const hi = Math.min(g.yMax, Math.max(lo, r.peak_device_bytes_high - fixed));
    const band = svgEl(doc, 'rect', { x: g.left, y: round(Y(hi)), width: pw, height: Math.max(1, round(Y(lo) - Y(hi))) },
      'xmem-range-band');
    band.appendChild(svgTitle(doc, `calibrated range of the reserved peak: ${formatGiB(lo)} – ${formatGiB(hi)}`));
    svg.appendChild(band);
  }

  const xs = tl.event.map(X);
  svg.appendChild(svgEl(doc, 'polyline', { points: stepPoints(xs, tl.reserved.map(Y)), fill: 'none' }, 'xmem-line-reserved'));
  svg.appendChild(svgEl(doc, 'polyline', { points: stepPoints(xs, tl.allocated.map(Y)), fill: 'none' }, 'xmem-line-allocated'));

  // The two peaks, each named as the headline's split names it; the reserved peak's label
  // moves up (or to the other side) if it would cover the allocated peak's.
  const taken: Box[] = [];
  const mark = (i: number, values: number[], text: string, cls: string, what: string): void => {
    const px = X(tl.event[i]);
    const py = Y(values[i]);
    const grp = svgEl(doc, 'g', {}, cls);
    grp.appendChild(svgEl(doc, 'line', { x1: round(px), x2: round(px), y1: round(py), y2: g.top + ph }, 'xmem-peak-line'));
    grp.appendChild(svgEl(doc, 'circle', { cx: round(px), cy: round(py), r: 4 }, 'xmem-peak-dot'));
    let anchor = px > g.left + pw * 0.6 ? 'end' : 'start';
    let lx = px + (anchor === 'end' ? -7 : 7);
    let ly = Math.max(g.top + 10, py - 6);
    for (let tries = 0; tries < 6 && taken.some(b => overlaps(b, labelBox(lx, ly, text, anchor))); tries++) {
      if (tries === 3) {
        anchor = anchor === 'end' ? 'start' : 'end';
        lx = px + (anchor === 'end' ? -7 : 7);
        ly = Math.max(g.top + 10, py - 6);
      } else {
        ly = ly - 14 < g.top + 10 ? ly + 28 : ly - 14;
      }
    }
    taken.push(labelBox(lx, ly, text, anchor));
    grp.appendChild(svgText(doc, lx, ly, text, 'xmem-peak-label', anchor));
    grp.appendChild(svgTitle(doc, `${text} at event ${tl.event[i]}: ${what}`));
    svg.appendChild(grp);
  };
  mark(pi, tl.allocated, allocatedText, 'xmem-peak', r.figures.items.allocated_peak?.about ?? 'the most the tensors hold at once');
  if (tl.reserved[ri] > 0) {
    mark(ri, tl.reserved, reservedText, 'xmem-peak xmem-reserved-peak',
      r.figures.items.reserved_peak?.about ?? 'the most the allocator reserves');
  }

  // Hover read-out.
  const cursor = svgEl(doc, 'line', { x1: 0, x2: 0, y1: g.top, y2: g.top + ph, visibility: 'hidden' }, 'xmem-cursor');
  const readout = svgText(doc, g.left + 4, g.top - 8, '', 'xmem-readout');
  svg.appendChild(cursor);
  svg.appendChild(readout);
  const overlay = svgEl(doc, 'rect', { x: g.left, y: g.top, width: pw, height: ph, fill: 'transparent' }, 'xmem-overlay');
  overlay.addEventListener('mousemove', (ev: Event) => {
    const me = ev as MouseEvent;
    const box = svg.getBoundingClientRect();
    if (!box.width) {
      return;
    }
    const vx = ((me.clientX - box.left) / box.width) * g.width;
    const e = ((vx - g.left) / pw) * g.xMax;
    const i = nearestSample(tl.event, e);
    const cx = String(round(X(tl.event[i])));
    cursor.setAttribute('x1', cx);
    cursor.setAttribute('x2', cx);
    cursor.setAttribute('visibility', 'visible');
    let phase = '';
    for (const [s, name] of tl.phases) {
      if (s <= tl.event[i]) {
        phase = name;
      }
    }
    readout.textContent =
      `event ${tl.event[i]}: allocated ${formatBytes(tl.allocated[i])}, reserved ${formatBytes(tl.reserved[i])}` +
      (phase ? ` (${phase})` : '');
  });
  overlay.addEventListener('mouseleave', () => {
    cursor.setAttribute('visibility', 'hidden');
    readout.textContent = '';
  });
  svg.appendChild(overlay);
  section.appendChild(svg);

  // Legend, under the chart.
  const legend = el(doc, 'div', 'xmem-legend');
  const items: Array<[string, string]> = [
    ['xmem-key-allocated', `allocated (${allocatedText})`],
    ['xmem-key-reserved', `reserved (${reservedText})`],
    ['xmem-key-gpu', capacityText + (g.capacityOnChart ? '' : ' (far above the chart)')],
    ['xmem-key-capacity', `${limitText} = capacity − context − libraries` + (g.limitOnChart ? '' : ' (far above the chart)')]
  ];
  const seen = new Set(tl.phases.map(p => p[1]));
  for (const name of ['forward', 'backward', 'optimizer']) {
    if (seen.has(name)) {
      items.push([`xmem-key-phase ${PHASE_CLASSES[name]}`, name]);
    }
  }
  for (const [cls, label] of items) {
    const item = el(doc, 'span', `xmem-legend-item ${cls === 'xmem-key-capacity' ? 'xmem-capacity-note' : ''}`);
    item.appendChild(el(doc, 'span', `xmem-key ${cls}`));
    item.appendChild(doc.createTextNode(label));
    legend.appendChild(item);
  }
  section.appendChild(legend);
  return section;
}

/**
 * The tensor-lifetime flame chart (the report's `flame`): each of the largest tensors a bar
 * from its allocation to its free, stacked so the height is the live memory, the smaller ones
 * summed per module, category and time bucket; coloured by category, on the timeline's x axis.
 */
export function renderFlame(r: Report, doc: Document): HTMLElement | null {
  const f = r.flame;
  if (!f || !f.left.length) {
    return null;
  }
  const section = el(doc, 'div', 'xmem-section xmem-flame');
  section.appendChild(el(doc, 'div', 'xmem-section-title', `Tensor lifetimes: ${f.n_tensors.toLocaleString('en-US')} tensors; height = live memory`));
  const width = CHART_BOX.width;
  const height = 220;
  const top = 10;
  const bottom = 22;
  const pw = width - CHART_BOX.left - CHART_BOX.right;
  const ph = height - top - bottom;
  const xMax = r.timeline ? timelineGeometry(r, r.timeline).xMax : Math.max(f.x_end, 1);
  const yMax = Math.max(maxOf(f.top), 1e-9) * 1.08;
  const X = (e: number): number => CHART_BOX.left + (pw * Math.min(e, xMax)) / xMax;
  const Y = (v: number): number => top + ph - (ph * v) / yMax;
  const present = Array.from(new Set(f.cat.map(c => f.categories[c] ?? 'other')));
  const classes = categoryClasses(present);
  const svg = svgEl(doc, 'svg', {
    viewBox: `0 0 ${width} ${height}`, width: '100%', role: 'img',
    'aria-label': `Flame chart: ${f.n_tensors} tensors over the step, by category (${present.join(', ')}); ` +
      `${figureText(r, 'allocated_peak')} at event ${f.peak_event}`
  }, 'xmem-chart xmem-flame-chart');
  svg.appendChild(svgTitle(doc, 'Tensor lifetimes, stacked: the height at any event is the live memory'));
  svg.appendChild(svgEl(doc, 'rect', { x: CHART_BOX.left, y: top, width: pw, height: ph }, 'xmem-plot-bg'));
  const step = niceStep(yMax, 3);
  for (let v = 0; v <= yMax + 1e-9; v += step) {
    svg.appendChild(svgEl(doc, 'line', { x1: CHART_BOX.left, x2: CHART_BOX.left + pw, y1: round(Y(v)), y2: round(Y(v)) }, 'xmem-grid'));
    svg.appendChild(svgText(doc, CHART_BOX.left - 6, Y(v) + 4, `${Number(v.toFixed(2))} ${f.unit}`, 'xmem-tick', 'end'));
  }
  const bars = svgEl(doc, 'g', {}, 'xmem-flame-bars');
  for (let i = 0; i < f.left.length; i++) {
    const x0 = X(f.left[i]);
    const x1 = X(f.right[i]);
    const y0 = Y(f.top[i]);
    const y1 = Y(f.bottom[i]);
    const cat = f.categories[f.cat[i]] ?? 'other';
    const rect = svgEl(doc, 'rect', {
      x: round(x0), y: round(y0), width: Math.max(0.3, round(x1 - x0)), height: Math.max(0.3, round(y1 - y0))
    }, `xmem-flame-bar ${classes.get(cat)}-fill`);
    const label = f.labels[f.label[i]];
    if (label) {
      rect.appendChild(svgTitle(doc, label));
    }
    bars.appendChild(rect);
  }
  svg.appendChild(bars);
  if (f.peak_event >= 0) {
    const px = round(X(f.peak_event));
    const line = svgEl(doc, 'line', { x1: px, x2: px, y1: top, y2: top + ph }, 'xmem-peak-line');
    line.appendChild(svgTitle(doc, `${figureText(r, 'allocated_peak')} at event ${f.peak_event}`));
    svg.appendChild(line);
  }
  svg.appendChild(svgText(doc, CHART_BOX.left, height - 6, '0', 'xmem-tick', 'start'));
  svg.appendChild(svgText(doc, CHART_BOX.left + pw, height - 6, String(Math.round(xMax)), 'xmem-tick', 'end'));
  section.appendChild(svg);
  const legend = el(doc, 'div', 'xmem-legend');
  for (const c of present) {
    const item = el(doc, 'span', 'xmem-legend-item');
    item.appendChild(el(doc, 'span', `xmem-swatch ${classes.get(c)}`));
    item.appendChild(doc.createTextNode(c));
    legend.appendChild(item);
  }
  section.appendChild(legend);
  for (const n of f.notes) {
    section.appendChild(el(doc, 'div', 'xmem-flame-note', n));
  }
  return section;
}

function renderFooter(r: Report, doc: Document): HTMLElement {
  const bits = [`xmem report v${r.version}`];
  if (r.gpu) {
    bits.push(`GPU ${r.gpu}`);
  }
  if (r.mode) {
    bits.push(`traced in ${r.mode} mode`);
  }
  if (r.n_events !== undefined) {
    bits.push(`${r.n_events.toLocaleString('en-US')} events`);
  }
  if (r.torch_version) {
    bits.push(`torch ${r.torch_version}`);
  }
  if (r.alloc_conf) {
    bits.push(`PYTORCH_CUDA_ALLOC_CONF=${r.alloc_conf}`);
  }
  if (r.seconds !== undefined) {
    bits.push(`${r.seconds.toFixed(1)} s`);
  }
  bits.push('saved output: shown without a kernel');
  return el(doc, 'div', 'xmem-footer', bits.join(' · '));
}

/** A report that cannot be shown: a clear message, never a blank. */
export function renderMessage(message: string, doc: Document, kind = 'invalid'): HTMLElement {
  const root = el(doc, 'div', `xmem-report xmem-report-error xmem-error-${kind === 'version' ? 'version' : 'invalid'}`);
  root.appendChild(el(doc, 'div', 'xmem-error-title', 'xmem: cannot show this saved estimate'));
  root.appendChild(el(doc, 'div', 'xmem-error-message', message));
  return root;
}

/** The whole report. Never throws: bad data renders a message. */
export function renderReport(data: unknown, doc: Document): HTMLElement {
  const parsed = parseReport(data);
  if (!parsed.ok) {
    return renderMessage(parsed.message, doc, parsed.kind);
  }
  const r = parsed.report;
  try {
    const root = el(doc, 'div', `xmem-report ${r.fits ? 'xmem-fits' : 'xmem-nofit'}`);
    for (const [name, colour] of r.palette) {
      root.style.setProperty(name, colour);
    }
    const headline = el(doc, 'div', 'xmem-headline');
    headline.appendChild(el(doc, 'span', 'xmem-verdict', r.fits ? '✔' : '✘'));
    headline.appendChild(el(doc, 'span', 'xmem-headline-text', headlineText(r)));
    root.appendChild(headline);
    root.appendChild(el(doc, 'div', 'xmem-split', splitText(r)));
    if (r.figures.steady) {
      root.appendChild(el(doc, 'div', 'xmem-steady', r.figures.steady));
    }
    if (r.figures.readings) {
      root.appendChild(el(doc, 'div', 'xmem-readings', r.figures.readings));
    }
    if (r.range) {
      root.appendChild(el(doc, 'div', 'xmem-range', r.range));
    }
    root.appendChild(renderDeviceBar(r, doc));
    if (r.notes.length) {
      const ul = el(doc, 'ul', 'xmem-notes');
      for (const n of r.notes) {
        ul.appendChild(el(doc, 'li', undefined, n));
      }
      root.appendChild(ul);
    }
    if (r.advice) {
      root.appendChild(renderAdvice(r.advice, doc));
    }
    const flame = renderFlame(r, doc);
    if (flame) {
      root.appendChild(flame);
    }
    root.appendChild(renderTimeline(r, doc));
    const cols = el(doc, 'div', 'xmem-columns');
    cols.appendChild(renderBreakdown(r, doc));
    const mods = renderModules(r, doc);
    if (mods) {
      cols.appendChild(mods);
    }
    root.appendChild(cols);
    const tensors = renderTopTensors(r, doc);
    if (tensors) {
      root.appendChild(tensors);
    }
    root.appendChild(renderFooter(r, doc));
    return root;
  } catch (err) {
    return renderMessage(`This xmem report could not be drawn: ${String(err)}`, doc);
  }
}
