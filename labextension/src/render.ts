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
  /** CSS custom properties (name -> #rrggbb) from the report's `palette`: the widget's colours. */
  palette: Array<[string, string]>;
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

/** What the peak is made of (`Estimate.headline_detail`), or the numbers in the largest unit. */
export function splitText(r: Report): string {
  return (
    r.headline_detail ??
    `CUDA context ${formatBytes(r.context_bytes)} + libraries ${formatBytes(r.outside_allocator_bytes)}` +
      ` + allocator reserved ${formatBytes(r.peak_reserved_bytes)}`
  );
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
    palette: parsePalette(data.palette)
  };
  return { ok: true, report };
}

const HEX_COLOUR = /^#[0-9a-fA-F]{6}$/;

/**
 * The report's `palette` (xmem_jupyter/palette.py) as CSS custom properties the stylesheet
 * reads. Only known names and `#rrggbb` values pass: nothing else from the data reaches CSS.
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
  take('lines', ['allocated', 'reserved', 'capacity', 'peak'], name => `--xmem-line-${name}`);
  take('verdict', ['fits', 'nofit'], name => `--xmem-${name}`);
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
export function renderDeviceBar(r: Report, doc: Document): HTMLElement {
  const wrap = el(doc, 'div', 'xmem-devicebar');
  const allocated = Math.min(r.peak_allocated_bytes, r.peak_reserved_bytes);
  const parts: Array<[string, string, number]> = [
    ['xmem-seg-context', 'CUDA context', r.context_bytes],
    ['xmem-seg-libraries', 'libraries (cuBLAS, cuDNN)', r.outside_allocator_bytes],
    ['xmem-seg-allocated', 'allocated by tensors at the peak', allocated],
    ['xmem-seg-cached', 'reserved but unused (cached)', Math.max(0, r.peak_reserved_bytes - allocated)],
    ['xmem-seg-free', 'free', Math.max(0, r.capacity_bytes - r.peak_device_bytes)]
  ];
  const total = Math.max(r.capacity_bytes, r.peak_device_bytes) || 1;
  const bar = el(doc, 'div', 'xmem-bar');
  bar.setAttribute('role', 'img');
  bar.setAttribute('aria-label', `device memory at the peak: ${splitText(r)}`);
  const legend = el(doc, 'div', 'xmem-legend');
  for (const [cls, label, bytes] of parts) {
    if (bytes <= 0) {
      continue;
    }
    const seg = el(doc, 'div', `xmem-seg ${cls}`);
    seg.style.width = `${((100 * bytes) / total).toFixed(3)}%`;
    seg.title = `${label}: ${formatBytes(bytes)}`;
    bar.appendChild(seg);
    const item = el(doc, 'span', 'xmem-legend-item');
    item.appendChild(el(doc, 'span', `xmem-swatch ${cls}`));
    item.appendChild(doc.createTextNode(`${label} ${formatGiB(bytes)}`));
    legend.appendChild(item);
  }
  if (r.peak_device_bytes > r.capacity_bytes) {
    const cap = el(doc, 'div', 'xmem-bar-capacity');
    cap.style.left = `${((100 * r.capacity_bytes) / total).toFixed(3)}%`;
    cap.title = `capacity ${formatGiB(r.capacity_bytes)}`;
    bar.appendChild(cap);
  }
  wrap.appendChild(bar);
  wrap.appendChild(legend);
  return wrap;
}

/** What is live at the peak, by category: a stacked bar and a table. */
export function renderBreakdown(r: Report, doc: Document): HTMLElement {
  const section = el(doc, 'div', 'xmem-section xmem-breakdown');
  section.appendChild(el(doc, 'div', 'xmem-section-title', 'Live at the peak, by kind'));
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
  section.appendChild(el(doc, 'div', 'xmem-section-title', 'Live at the peak, by module'));
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
  details.appendChild(el(doc, 'summary', 'xmem-section-title', `Largest tensors live at the peak (${r.top_tensors.length})`));
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
}

/** Axis ranges: the limit the allocator may reserve is drawn when it is within reach. */
export function timelineGeometry(r: Report, tl: ReportTimeline): TimelineGeometry {
  const limit = Math.max(0, r.capacity_bytes - r.context_bytes - r.outside_allocator_bytes);
  const band = (r.peak_device_bytes_high ?? 0) - r.context_bytes - r.outside_allocator_bytes;
  const top = Math.max(maxOf(tl.reserved), maxOf(tl.allocated), band, 1);
  const limitOnChart = limit <= top * 4;
  const yMax = (limitOnChart ? Math.max(limit, top) : top) * 1.08;
  const xMax = Math.max(tl.event[tl.event.length - 1], (r.n_events ?? 0) - 1, 1);
  return { width: 720, height: 240, left: 74, right: 16, top: 22, bottom: 34, xMax, yMax, limit, limitOnChart };
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

/** The memory timeline: reserved and allocated over the events, the limit, the peak. */
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

  const svg = svgEl(doc, 'svg', {
    viewBox: `0 0 ${g.width} ${g.height}`,
    width: '100%',
    role: 'img',
    'aria-label':
      `Memory timeline: allocated peaks at ${formatBytes(maxOf(tl.allocated))}, ` +
      `reserved at ${formatBytes(maxOf(tl.reserved))}`
  }, 'xmem-chart');
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

  // The limit the allocator may reserve (capacity - context - libraries).
  if (g.limitOnChart) {
    const y = round(Y(g.limit));
    const line = svgEl(doc, 'line', { x1: g.left, x2: g.left + pw, y1: y, y2: y }, 'xmem-line-capacity');
    line.appendChild(svgTitle(doc, `usable by PyTorch: ${formatBytes(g.limit)} (capacity − CUDA context − libraries)`));
    svg.appendChild(line);
    svg.appendChild(svgText(doc, g.left + pw - 4, y - 4, `limit ${formatGiB(g.limit)}`, 'xmem-capacity-label', 'end'));
  }

  // The calibrated range of the reserved peak: the device range less context and libraries.
  if (r.peak_device_bytes_low !== undefined && r.peak_device_bytes_high !== undefined) {
    const fixed = r.context_bytes + r.outside_allocator_bytes;
    const lo = Math.max(0, r.peak_device_bytes_low - fixed);
    const hi = Math.min(g.yMax, Math.max(lo, r.peak_device_bytes_high - fixed));
    const band = svgEl(doc, 'rect', { x: g.left, y: round(Y(hi)), width: pw, height: Math.max(1, round(Y(lo) - Y(hi))) },
      'xmem-range-band');
    band.appendChild(svgTitle(doc, `calibrated range of the reserved peak: ${formatBytes(lo)} – ${formatBytes(hi)}`));
    svg.appendChild(band);
  }

  const xs = tl.event.map(X);
  svg.appendChild(svgEl(doc, 'polyline', { points: stepPoints(xs, tl.reserved.map(Y)), fill: 'none' }, 'xmem-line-reserved'));
  svg.appendChild(svgEl(doc, 'polyline', { points: stepPoints(xs, tl.allocated.map(Y)), fill: 'none' }, 'xmem-line-allocated'));

  // Peak marker.
  const pi = peakIndex(tl);
  const px = X(tl.event[pi]);
  const py = Y(tl.allocated[pi]);
  const peak = svgEl(doc, 'g', {}, 'xmem-peak');
  peak.appendChild(svgEl(doc, 'line', { x1: round(px), x2: round(px), y1: round(py), y2: g.top + ph }, 'xmem-peak-line'));
  peak.appendChild(svgEl(doc, 'circle', { cx: round(px), cy: round(py), r: 4 }, 'xmem-peak-dot'));
  const anchor = px > g.left + pw * 0.7 ? 'end' : 'start';
  peak.appendChild(
    svgText(doc, px + (anchor === 'end' ? -7 : 7), Math.max(g.top + 10, py - 6), `peak ${formatBytes(tl.allocated[pi])}`, 'xmem-peak-label', anchor)
  );
  peak.appendChild(svgTitle(doc, `peak allocated ${formatBytes(tl.allocated[pi])} at event ${tl.event[pi]}`));
  svg.appendChild(peak);

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

  // Legend.
  const legend = el(doc, 'div', 'xmem-legend');
  const items: Array<[string, string]> = [
    ['xmem-key-allocated', 'allocated'],
    ['xmem-key-reserved', 'reserved'],
    [
      'xmem-key-capacity',
      `limit ${formatGiB(g.limit)} = capacity − context − libraries` + (g.limitOnChart ? '' : ' (far above the chart)')
    ],
    ['xmem-key-peak', 'peak']
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
