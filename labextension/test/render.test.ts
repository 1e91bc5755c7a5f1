/**
 * Unit tests of the renderer (node's test runner + jsdom), against the same example reports
 * the Python side validates: xmem_engine/data/report-examples/*.json.
 */
import { strict as assert } from 'node:assert';
import { readdirSync, readFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { describe, it } from 'node:test';

import { JSDOM } from 'jsdom';

import {
  fixed2,
  formatBytes,
  nearestSample,
  formatGiB,
  headlineText,
  splitText,
  parseReport,
  peakIndex,
  renderReport,
  Report,
  REPORT_MIME,
  SUPPORTED_VERSION,
  timelineGeometry
} from '../src/render';

// build-test/test/render.test.js -> repository root
const ROOT = resolve(__dirname, '..', '..', '..');
const EXAMPLES = join(ROOT, 'xmem_engine', 'data', 'report-examples');

function example(name: string): any {
  return JSON.parse(readFileSync(join(EXAMPLES, name), 'utf8'));
}

function dom(): Document {
  return new JSDOM('<!doctype html><html><body></body></html>').window.document;
}

function render(data: unknown): HTMLElement {
  const doc = dom();
  const node = renderReport(data, doc);
  doc.body.appendChild(node);
  return node;
}

function parsed(data: unknown): Report {
  const p = parseReport(data);
  assert.ok(p.ok, 'expected a valid report');
  return (p as { ok: true; report: Report }).report;
}

describe('formatting', () => {
  it('formats GiB with two decimals', () => {
    assert.equal(formatGiB(3.21 * 1024 ** 3), '3.21 GiB');
    assert.equal(formatGiB(8318222336), '7.75 GiB');
    assert.equal(formatGiB(0), '0.00 GiB');
  });

  it('rounds ties to even, like Python\'s f"{x:.2f}"', () => {
    assert.equal(formatGiB(10.625 * 1024 ** 3), '10.62 GiB');
    assert.equal(formatGiB(2.875 * 1024 ** 3), '2.88 GiB');
    assert.equal(formatGiB(-2.875 * 1024 ** 3), '-2.88 GiB');
    assert.equal(formatGiB(-1), '0.00 GiB');
    assert.equal(fixed2(1023, 1024), '1.00');
    assert.equal(fixed2(1.005 * 1024, 1024), '1.00');
  });

  it('formats bytes in the largest fitting binary unit', () => {
    assert.equal(formatBytes(512), '512 B');
    assert.equal(formatBytes(1536), '1.50 KiB');
    assert.equal(formatBytes(16777216), '16.00 MiB');
    assert.equal(formatBytes(-2 * 1024 ** 3), '-2.00 GiB');
  });

  it('shows the headline xmem wrote, and a bare verdict for reports that carry none', () => {
    const r = parsed(example('mlp-rtx4060.json'));
    assert.equal(headlineText(r), 'Peak 0.62 GiB of 7.75 GiB on NVIDIA GeForce RTX 4060 — fits (headroom 7.13 GiB)');
    const nofit = parsed(example('mlp-large-rtx4060-does-not-fit.json'));
    assert.equal(headlineText(nofit), 'Peak 10.62 GiB of 7.75 GiB on NVIDIA GeForce RTX 4060 — does not fit (short by 2.88 GiB)');
    const older = { ...r, headline: undefined, headline_detail: undefined };
    assert.equal(headlineText(older), 'NVIDIA GeForce RTX 4060: fits');
    assert.equal(headlineText({ ...older, fits: false }), 'NVIDIA GeForce RTX 4060: does not fit');
    // no figures in the report (written before xmem_jupyter/figures.py): the same names, from its fields
    assert.equal(splitText(r), 'peak device memory 0.62 GiB = CUDA context 0.42 GiB + libraries 0.00 GiB + ' +
      'reserved peak 0.20 GiB (allocated peak 0.17 GiB + reserved above the allocated peak 0.03 GiB: cached blocks and fragmentation)');
    // with them, their words as xmem wrote them
    const figures = { items: { context: { name: 'CUDA context', bytes: 1, about: '' } }, split: ['context'], text: 'as written' };
    assert.equal(splitText(parsed({ ...example('mlp-rtx4060.json'), figures })), 'as written');
  });
});

describe('nearestSample', () => {
  it('finds the nearest event', () => {
    assert.equal(nearestSample([0, 4, 10], -3), 0);
    assert.equal(nearestSample([0, 4, 10], 1.9), 0);
    assert.equal(nearestSample([0, 4, 10], 2.1), 1);
    assert.equal(nearestSample([0, 4, 10], 8), 2);
    assert.equal(nearestSample([0, 4, 10], 99), 2);
    assert.equal(nearestSample([7], 3), 0);
  });
});

describe('every example report renders something', () => {
  const files = readdirSync(EXAMPLES).filter(f => f.endsWith('.json'));
  it('has the example files', () => {
    assert.ok(files.includes('mlp-rtx4060.json'));
    assert.ok(files.length >= 4, `only ${files.length} examples`);
  });
  for (const f of files) {
    it(f, () => {
      const node = render(example(f));
      assert.ok(node.classList.contains('xmem-report'));
      assert.ok((node.textContent ?? '').trim().length > 20, 'rendered (nearly) nothing');
      const data = example(f);
      if (data.version === SUPPORTED_VERSION) {
        assert.ok(node.querySelector('.xmem-headline'), 'no headline');
        assert.ok(node.querySelector('svg.xmem-chart'), 'no chart');
        assert.equal(node.querySelector('.xmem-headline-text')?.textContent, headlineText(parsed(data)));
      } else {
        assert.ok(node.classList.contains('xmem-report-error'));
      }
    });
  }
});

describe('a report that fits (mlp-rtx4060.json)', () => {
  const data = example('mlp-rtx4060.json');
  const node = render(data);

  it('shows the headline, verdict and split', () => {
    assert.ok(node.classList.contains('xmem-fits'));
    assert.equal(
      node.querySelector('.xmem-headline-text')?.textContent,
      'Peak 0.62 GiB of 7.75 GiB on NVIDIA GeForce RTX 4060 — fits (headroom 7.13 GiB)'
    );
    assert.equal(
      node.querySelector('.xmem-split')?.textContent,
      'peak device memory 0.62 GiB = CUDA context 0.42 GiB + libraries 0.00 GiB + reserved peak 0.20 GiB ' +
        '(allocated peak 0.17 GiB + reserved above the allocated peak 0.03 GiB: cached blocks and fragmentation)'
    );
  });

  it('draws the device bar with context, allocated, cached and free', () => {
    const bar = node.querySelector('.xmem-devicebar .xmem-bar')!;
    for (const cls of ['xmem-seg-context', 'xmem-seg-allocated', 'xmem-seg-cached', 'xmem-seg-free']) {
      assert.ok(bar.querySelector(`.${cls}`), cls);
    }
    // no libraries segment when there are none
    assert.equal(bar.querySelector('.xmem-seg-libraries'), null);
    const widths = Array.from(bar.querySelectorAll<HTMLElement>('.xmem-seg')).map(s => parseFloat(s.style.width));
    assert.ok(Math.abs(widths.reduce((a, b) => a + b, 0) - 100) < 0.01, `widths sum to ${widths}`);
  });

  it('lists the breakdown at the peak, largest first', () => {
    const rows = Array.from(node.querySelectorAll<HTMLTableRowElement>('.xmem-breakdown tbody tr'));
    assert.equal(rows.length, Object.keys(data.breakdown).length);
    assert.equal(rows[0].cells[0].textContent, 'optimizer_state');
    assert.equal(rows[0].cells[1].textContent, '64.04 MiB');
    assert.equal(node.querySelectorAll('.xmem-breakdown-bar .xmem-seg').length, rows.length);
  });

  it('lists modules and the top tensors', () => {
    assert.equal(node.querySelectorAll('.xmem-modules tbody tr').length, 3);
    const tensors = node.querySelectorAll('.xmem-tensors tbody tr');
    assert.equal(tensors.length, data.top_tensors.length);
    assert.equal(tensors[0].querySelectorAll('td')[2].textContent, '[4096, 1024]');
  });

  it('draws the timeline: reserved and allocated lines, phases, iterations, peak', () => {
    const svg = node.querySelector('svg.xmem-chart')!;
    assert.equal(svg.namespaceURI, 'http://www.w3.org/2000/svg');
    const allocated = svg.querySelector('polyline.xmem-line-allocated')!;
    const reserved = svg.querySelector('polyline.xmem-line-reserved')!;
    const n = data.timeline.event.length;
    // step lines: 2 points per sample but the first
    assert.equal(allocated.getAttribute('points')!.split(' ').length, 2 * n - 1);
    assert.equal(reserved.getAttribute('points')!.split(' ').length, 2 * n - 1);
    assert.equal(svg.querySelectorAll('.xmem-iteration').length, data.timeline.iterations.length);
    assert.ok(svg.querySelectorAll('.xmem-phase-forward').length >= 2);
    assert.ok(svg.querySelectorAll('.xmem-phase-backward').length >= 2);
    const peak = svg.querySelector('.xmem-peak-dot')!;
    assert.ok(peak);
    // named as the headline's split names it: the allocated peak, not "the peak"
    assert.match(svg.querySelector('.xmem-peak-label')!.textContent!, /^allocated peak 0\.17 GiB$/);
    assert.match(svg.querySelector('.xmem-reserved-peak .xmem-peak-label')!.textContent!, /^reserved peak 0\.20 GiB$/);
    // the limit is ~40x the peak: not drawn to scale, but said
    assert.equal(svg.querySelector('.xmem-line-capacity'), null);
    assert.equal(svg.querySelector('.xmem-line-gpu'), null);
    assert.equal(
      node.querySelector('.xmem-timeline .xmem-capacity-note')!.textContent,
      'allocator limit 7.33 GiB = capacity − context − libraries (far above the chart)'
    );
  });

  it('puts the peak marker at the saved peak event, at the top of the allocated line', () => {
    const r = parsed(data);
    const tl = r.timeline!;
    const i = peakIndex(tl);
    assert.equal(tl.event[i], data.timeline.peak_event);
    assert.equal(tl.allocated[i], Math.max(...tl.allocated));
    const svg = node.querySelector('svg.xmem-chart')!;
    const cy = parseFloat(svg.querySelector('.xmem-peak-dot')!.getAttribute('cy')!);
    const ys = allocatedYs(svg);
    assert.equal(cy, Math.min(...ys)); // SVG y grows downwards
  });

  it('shows a read-out on hover', () => {
    const svg = node.querySelector('svg.xmem-chart') as SVGSVGElement;
    const g = timelineGeometry(parsed(data), parsed(data).timeline!);
    svg.getBoundingClientRect = () => ({ left: 0, top: 0, width: g.width, height: g.height, right: g.width, bottom: g.height, x: 0, y: 0, toJSON: () => ({}) });
    const overlay = svg.querySelector('.xmem-overlay')!;
    const win = svg.ownerDocument.defaultView!;
    const peakX = parseFloat(svg.querySelector('.xmem-peak-dot')!.getAttribute('cx')!);
    overlay.dispatchEvent(new win.MouseEvent('mousemove', { clientX: peakX + 0.01, clientY: 50 }));
    assert.equal(svg.querySelector('.xmem-readout')!.textContent, 'event 50: allocated 177.35 MiB, reserved 208.00 MiB (optimizer)');
    assert.equal(svg.querySelector('.xmem-cursor')!.getAttribute('visibility'), 'visible');
    overlay.dispatchEvent(new win.MouseEvent('mouseleave'));
    assert.equal(svg.querySelector('.xmem-readout')!.textContent, '');
  });

  it('shows where the report comes from', () => {
    const footer = node.querySelector('.xmem-footer')!.textContent!;
    assert.match(footer, /xmem report v1/);
    assert.match(footer, /traced in fake mode/);
    assert.match(footer, /122 events/);
    assert.match(footer, /torch 2\.13\.0/);
  });
});

function allocatedYs(svg: Element): number[] {
  return svg
    .querySelector('polyline.xmem-line-allocated')!
    .getAttribute('points')!
    .split(' ')
    .map(p => parseFloat(p.split(',')[1]));
}

describe('a report that does not fit (mlp-large-rtx4060-does-not-fit.json)', () => {
  const data = example('mlp-large-rtx4060-does-not-fit.json');
  const node = render(data);

  it('says so in the headline', () => {
    assert.ok(node.classList.contains('xmem-nofit'));
    assert.equal(
      node.querySelector('.xmem-headline-text')!.textContent,
      'Peak 10.62 GiB of 7.75 GiB on NVIDIA GeForce RTX 4060 — does not fit (short by 2.88 GiB)'
    );
    assert.equal(node.querySelector('.xmem-verdict')!.textContent, '✘');
  });

  it('marks the capacity on the device bar and draws the limit on the chart', () => {
    assert.ok(node.querySelector('.xmem-bar-capacity'));
    assert.equal(node.querySelector('.xmem-seg-free'), null);
    const svg = node.querySelector('svg.xmem-chart')!;
    const limit = svg.querySelector('.xmem-line-capacity')!;
    assert.ok(limit, 'no capacity line');
    const y = parseFloat(limit.getAttribute('y1')!);
    // the allocated line goes above (smaller y than) the limit
    assert.ok(Math.min(...allocatedYs(svg)) < y);
    // the GPU's capacity is drawn too, apart from the limit: another line, another class
    const gpu = svg.querySelector('.xmem-line-gpu')!;
    assert.ok(gpu && parseFloat(gpu.getAttribute('y1')!) < y);
    assert.equal(node.querySelector('.xmem-timeline .xmem-capacity-note')!.textContent,
      'allocator limit 7.33 GiB = capacity − context − libraries');
  });

  it('shows the notes (the out-of-memory message)', () => {
    const notes = Array.from(node.querySelectorAll('.xmem-notes li')).map(li => li.textContent);
    assert.equal(notes.length, 1);
    assert.match(notes[0]!, /runs out of memory/);
  });
});

describe('untrusted data is shown as text (markup-in-names.json)', () => {
  const data = example('markup-in-names.json');
  const node = render(data);
  const text = node.textContent!;

  it('creates no element from the data', () => {
    assert.equal(node.querySelectorAll('img, script, iframe, a, style, b, object, embed, link, meta').length, 0);
    // the only svg is the chart
    assert.equal(node.querySelectorAll('svg').length, 1);
    for (const e of Array.from(node.querySelectorAll('*'))) {
      for (const attr of Array.from(e.attributes)) {
        assert.ok(!attr.name.startsWith('on'), `${e.tagName} has ${attr.name}`);
        assert.ok(!/javascript:/i.test(attr.value), `${e.tagName} ${attr.name}=${attr.value}`);
      }
    }
  });

  it('shows the markup as text', () => {
    assert.ok(text.includes('<img src=x onerror=alert(1)>'));
    assert.ok(text.includes('encoder.<script>alert(2)</script>'));
    assert.ok(text.includes('<svg onload=alert(4)>'));
    assert.ok(text.includes('<cell>:3 <a href="javascript:alert(5)">click</a>'));
    assert.ok(text.includes('<iframe src="javascript:alert(6)"></iframe>'));
    assert.ok(text.includes('<style>*{display:none}</style>'));
    assert.ok(text.includes('<b onmouseover=alert(3)>bold</b>'));
    assert.ok(text.includes('<script>alert(7)</script>'));
    assert.ok(text.includes('PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True<script>alert("conf")</script>'));
    const moduleCells = Array.from(node.querySelectorAll('.xmem-modules tbody td:first-child')).map(c => c.textContent);
    assert.ok(moduleCells.includes('<img src=x onerror=alert(1)>'));
  });

  it('still draws the chart and headline', () => {
    assert.ok(node.querySelector('svg.xmem-chart polyline.xmem-line-allocated'));
    assert.match(node.querySelector('.xmem-headline-text')!.textContent!, /^Peak 0\.62 GiB of 7\.75 GiB/);
  });
});

describe('reports this viewer cannot show render a clear message', () => {
  it('an unknown version (unknown-version-99.json)', () => {
    const node = render(example('unknown-version-99.json'));
    assert.ok(node.classList.contains('xmem-error-version'));
    assert.equal(node.querySelector('svg'), null);
    const msg = node.querySelector('.xmem-error-message')!.textContent!;
    assert.match(msg, /format version 99/);
    assert.match(msg, /reads version 1/);
    assert.match(msg, /newer xmem: update xmem/);
    assert.match(node.querySelector('.xmem-error-title')!.textContent!, /cannot show this saved estimate/);
  });

  const bad: Array<[string, unknown, RegExp]> = [
    ['null', null, /not an xmem report/],
    ['a number', 42, /not an xmem report/],
    ['an array', [1, 2], /not an xmem report/],
    ['invalid JSON text', '{"version": 1,', /not valid JSON/],
    ['no version', { gpu: 'T4' }, /no report format version/],
    ['version as text', { version: '1' }, /format version 1; this viewer reads version 1/],
    ['missing headline fields', { version: 1, gpu_name: 'T4' }, /incomplete: missing or invalid capacity_bytes/],
    ['a non-numeric peak', { ...example('mlp-rtx4060.json'), peak_device_bytes: '1 GiB' }, /peak_device_bytes/],
    ['fits not a boolean', { ...example('mlp-rtx4060.json'), fits: 'yes' }, /fits/]
  ];
  for (const [what, data, re] of bad) {
    it(what, () => {
      const node = render(data);
      assert.ok(node.classList.contains('xmem-report-error'));
      assert.match(node.textContent!, re);
    });
  }

  it('a report given as JSON text is parsed', () => {
    const node = render(JSON.stringify(example('mlp-rtx4060.json')));
    assert.ok(node.querySelector('svg.xmem-chart'));
  });

  it('a report without a (valid) timeline still shows its headline', () => {
    for (const timeline of [undefined, null, {}, { event: [1], allocated: ['x'], reserved: [1] }, { event: [], allocated: [], reserved: [] }]) {
      const node = render({ ...example('mlp-rtx4060.json'), timeline });
      assert.ok(node.querySelector('.xmem-headline'));
      assert.equal(node.querySelector('svg'), null);
      assert.match(node.querySelector('.xmem-timeline')!.textContent!, /No timeline in this report/);
    }
  });

  it('ignores malformed parts and unknown fields', () => {
    const data = {
      ...example('mlp-rtx4060.json'),
      breakdown: { parameter: 1024, weird: 'lots', nested: { a: 1 } },
      top_tensors: [null, 'x', { bytes: 'big' }, { bytes: 2048, shape: 'oops' }],
      notes: 'not a list',
      a_future_field: { anything: true }
    };
    const node = render(data);
    assert.equal(node.querySelectorAll('.xmem-breakdown tbody tr').length, 1);
    assert.equal(node.querySelectorAll('.xmem-tensors tbody tr').length, 1);
    assert.equal(node.querySelector('.xmem-notes'), null);
  });

  it('the MIME type is the one the magic writes', () => {
    assert.equal(REPORT_MIME, 'application/vnd.xmem.report+json');
  });
});

describe('the palette the widget used', () => {
  const palette = {
    categories: { activation: '#2ca02c', temporary: '#d62728', 'made-up': '#123456' },
    phases: { forward: '#2ca02c', backward: 'red', optimizer: '#9467bd' },
    device: { allocated: '#0969da' },
    lines: { peak: 'url(javascript:alert(1))', capacity: '#cf222e' },
    verdict: { fits: '#1a7f37' },
    '--evil': { x: '#000000' }
  };

  it('becomes CSS custom properties, known names and #rrggbb only', () => {
    const node = render({ ...example('mlp-rtx4060.json'), palette });
    const style = node.style;
    assert.equal(style.getPropertyValue('--xmem-c3'), '#2ca02c'); // activation's slot
    assert.equal(style.getPropertyValue('--xmem-c4'), '#d62728'); // temporary's slot
    assert.equal(style.getPropertyValue('--xmem-phase-forward'), '#2ca02c');
    assert.equal(style.getPropertyValue('--xmem-phase-optimizer'), '#9467bd');
    assert.equal(style.getPropertyValue('--xmem-phase-backward'), ''); // "red" is not #rrggbb
    assert.equal(style.getPropertyValue('--xmem-dev-allocated'), '#0969da');
    // text and thin marks take the theme's shade from the stylesheet (style/palette.css), so
    // the data's light shades never override a dark theme
    assert.equal(style.getPropertyValue('--xmem-line-capacity'), '');
    assert.equal(style.getPropertyValue('--xmem-line-peak'), '');
    assert.equal(style.getPropertyValue('--xmem-fits'), '');
    assert.ok(!node.getAttribute('style')!.includes('javascript'));
    assert.ok(!node.getAttribute('style')!.includes('123456'));
  });

  it('a report without one keeps the stylesheet colours', () => {
    assert.equal(render(example('mlp-rtx4060.json')).getAttribute('style'), null);
    assert.deepEqual(parsed({ ...example('mlp-rtx4060.json'), palette: 'x' }).palette, []);
  });
});

describe('the calibrated range', () => {
  it('is said in words and drawn as a band around the reserved peak', () => {
    const r = example('mlp-rtx4060.json');
    const fixed = r.context_bytes + r.outside_allocator_bytes;
    const node = render({ ...r, peak_device_bytes_low: fixed + r.peak_reserved_bytes * 0.9,
      peak_device_bytes_high: fixed + r.peak_reserved_bytes * 1.1, range: 'range 0.60-0.70 GiB (other step)' });
    assert.equal(node.querySelector('.xmem-range')!.textContent, 'range 0.60-0.70 GiB (other step)');
    const band = node.querySelector('rect.xmem-range-band')!;
    assert.ok(Number(band.getAttribute('height')) > 1);
  });

  it('a report without one draws no band', () => {
    const node = render(example('mlp-rtx4060.json'));
    assert.equal(node.querySelector('rect.xmem-range-band'), null);
    assert.equal(node.querySelector('.xmem-range'), null);
  });
});

describe('one set of figures, the flame chart, labels that do not overlap', () => {
  // a report as xmem_jupyter writes it: figures (figures.py) and a flame chart (flame.py)
  const GiB = 1024 ** 3;
  const base = example('mlp-rtx4060.json');
  const figures = {
    items: {
      device_peak: { name: 'peak device memory', bytes: 3 * GiB, about: 'what nvidia-smi shows' },
      capacity: { name: 'GPU capacity', bytes: base.capacity_bytes, about: '' },
      allocator_limit: { name: 'allocator limit', bytes: 7.33 * GiB, about: '' },
      context: { name: 'CUDA context', bytes: 0.5 * GiB, about: 'the context' },
      libraries: { name: 'libraries', bytes: 0.25 * GiB, about: 'kernels' },
      reserved_peak: { name: 'reserved peak', bytes: 2.25 * GiB, about: '' },
      allocated_peak: { name: 'allocated peak', bytes: 1.5 * GiB, about: 'the most the tensors hold' },
      reserved_above: { name: 'reserved above the allocated peak', bytes: 0.75 * GiB, about: 'cache' }
    },
    split: ['context', 'libraries', 'allocated_peak', 'reserved_above'],
    text: 'peak device memory 3.00 GiB = ...',
    readings: 'total - free 3.47 GiB as NVML v1 reads it = peak device memory 3.00 GiB as nvidia-smi reads it + driver reserve 0.47 GiB',
    steady: 'first-step peak 2.50 GiB; peak device memory 3.00 GiB over 2 steps, the steady state'
  };
  const flame = {
    unit: 'MiB', scale: 1048576, x_end: 40, n_tensors: 3, categories: ['parameter', 'activation', 'temporary'],
    left: [0, 5, 10], right: [40, 20, 12], bottom: [0, 10, 10], top: [10, 30, 50], cat: [0, 1, 2],
    label: [0, 1, 1], labels: ['tensor #1 <img src=x onerror=alert(1)>', 'tensor #2'], peak_event: 10, notes: ['n']
  };
  const node = render({ ...base, figures, flame });

  it('names and measures each device bar part as the figures do', () => {
    const titles = Array.from(node.querySelectorAll('.xmem-devicebar .xmem-seg')).map(s => (s as HTMLElement).title);
    assert.deepEqual(titles.slice(0, 4), [
      'CUDA context 0.50 GiB: the context', 'libraries 0.25 GiB: kernels',
      'allocated peak 1.50 GiB: the most the tensors hold', 'reserved above the allocated peak 0.75 GiB: cache'
    ]);
    assert.equal(node.querySelector('.xmem-split')!.textContent, 'peak device memory 3.00 GiB = ...');
    assert.equal(node.querySelector('.xmem-steady')!.textContent, figures.steady);
    assert.equal(node.querySelector('.xmem-readings')!.textContent, figures.readings);
    const labels = Array.from(node.querySelectorAll('svg.xmem-timeline-chart .xmem-peak-label')).map(t => t.textContent);
    assert.deepEqual(labels, ['allocated peak 1.50 GiB', 'reserved peak 2.25 GiB']);
  });

  it('draws the flame chart: a bar per rectangle, its category colour, its label as text', () => {
    const bars = node.querySelectorAll('.xmem-flame svg rect.xmem-flame-bar');
    assert.equal(bars.length, 3);
    assert.ok(bars[1].getAttribute('class')!.includes('xmem-c3-fill')); // activation's colour slot
    assert.equal(bars[0].querySelector('title')!.textContent, 'tensor #1 <img src=x onerror=alert(1)>');
    assert.equal(node.querySelectorAll('.xmem-flame img').length, 0);
    // on the timeline's x axis: the last event is at the plot's right edge in both
    const right = (svg: Element, x: number) => Number(svg.querySelector('.xmem-plot-bg')!.getAttribute('x')) + x;
    assert.equal(right(node.querySelector('svg.xmem-flame-chart')!, 0), right(node.querySelector('svg.xmem-timeline-chart')!, 0));
  });

  it('moves a peak label that would cover the other', () => {
    const tl = base.timeline;
    const n = tl.event.length;
    // the reserved line peaks where allocated does, a hair above it: their labels would collide
    const reserved = tl.allocated.map((a: number, i: number) => (i === n >> 1 ? a * 50 + 1 : a * 50));
    const allocated = tl.allocated.map((a: number, i: number) => (i === n >> 1 ? a * 50 : a));
    const svg = render({ ...base, figures, timeline: { ...tl, reserved, allocated, peak_event: tl.event[n >> 1] } })
      .querySelector('svg.xmem-timeline-chart')!;
    const boxes = Array.from(svg.querySelectorAll('.xmem-peak-label')).map(t => {
      const x = Number(t.getAttribute('x'));
      const y = Number(t.getAttribute('y'));
      const w = t.textContent!.length * 6.2;
      const x0 = t.getAttribute('text-anchor') === 'end' ? x - w : x;
      return { x0, x1: x0 + w, y0: y - 11, y1: y + 3 };
    });
    assert.equal(boxes.length, 2);
    const [a, b] = boxes;
    assert.ok(!(a.x0 < b.x1 && b.x0 < a.x1 && a.y0 < b.y1 && b.y0 < a.y1), JSON.stringify(boxes));
  });
});
