/**
 * The live widget for the keyboard, screen readers and the theme (src/access.ts), under jsdom:
 * controls keep their keys in JupyterLab, the slider says the batch size, the charts are a
 * described figure, and a theme change repaints every Bokeh figure and legend.
 */
import { strict as assert } from 'node:assert';
import { describe, it } from 'node:test';

import { JSDOM } from 'jsdom';

import { decorateWidget, repaintBokeh, watchTheme } from '../src/access';

// what ipywidgets draws for the widget's controls, reduced to the parts access.ts reads
const WIDGET = `
<div class="xmem-widget">
  <div class="widget-dropdown xmem-gpu"><label class="widget-label">GPU</label><select><option>T4</option></select></div>
  <div class="widget-slider xmem-batch-slider"><label class="widget-label">batch</label>
    <div class="noUi-handle" role="slider" aria-valuenow="1" tabindex="0"></div><div class="widget-readout">32</div></div>
  <div class="widget-text xmem-batch-entry"><label class="widget-label">batch =</label><input type="text"></div>
  <button>what would make it fit</button>
  <div class="xmem-chart-summary"><div class="xmem-chart-text">Charts: allocated peak 1.00 GiB.</div></div>
  <div class="xmem-charts"><canvas></canvas></div>
</div>
<select class="not-ours"></select>`;

describe('decorateWidget', () => {
  const doc = new JSDOM(`<!doctype html><html><body>${WIDGET}</body></html>`).window.document;
  decorateWidget(doc.body);

  it('marks every control so that JupyterLab leaves its keys alone', () => {
    for (const sel of ['.xmem-widget select', '.xmem-widget input', '.xmem-widget button', '.noUi-handle']) {
      assert.equal(doc.querySelector(sel)!.getAttribute('data-lm-suppress-shortcuts'), 'true', sel);
    }
    assert.equal(doc.querySelector('select.not-ours')!.hasAttribute('data-lm-suppress-shortcuts'), false);
  });

  it('has the slider say the batch size, not its index', () => {
    const handle = doc.querySelector('.noUi-handle')!;
    assert.equal(handle.getAttribute('aria-valuetext'), 'batch 32');
    doc.querySelector('.widget-readout')!.textContent = '128';
    decorateWidget(doc.body);
    assert.equal(handle.getAttribute('aria-valuetext'), 'batch 128');
  });

  it('makes the charts a figure described by their text', () => {
    const charts = doc.querySelector('.xmem-charts')!;
    const text = doc.querySelector('.xmem-chart-text')!;
    assert.equal(charts.getAttribute('role'), 'figure');
    assert.ok(text.id && charts.getAttribute('aria-describedby') === text.id);
    const id = text.id;
    decorateWidget(doc.body); // idempotent
    assert.equal(text.id, id);
    // the widget writes its text anew (a GPU switch): the new element takes the same id
    doc.querySelector('.xmem-chart-summary')!.innerHTML = '<div class="xmem-chart-text">Charts: other.</div>';
    decorateWidget(doc.body);
    assert.equal(doc.querySelector('.xmem-chart-text')!.id, id);
    assert.equal(charts.getAttribute('aria-describedby'), id);
  });
});

describe('repaintBokeh', () => {
  it('repaints every figure and re-renders every legend, once each', () => {
    const calls: string[] = [];
    const legend = { model: { type: 'Legend' }, rerender: () => calls.push('legend') };
    const plot = (name: string) => ({
      model: { type: 'Figure' },
      request_paint: () => calls.push(name),
      renderer_views: new Map([[1, legend]]) as Map<unknown, any>
    });
    const a = plot('a');
    const b = plot('b');
    const column = { model: { type: 'Column' }, child_views: [a, b, a] };
    const win = { Bokeh: { index: { roots: [column] } } } as unknown as Window;
    assert.equal(repaintBokeh(win), 2);
    assert.deepEqual(calls.sort(), ['a', 'b', 'legend']);
    assert.equal(repaintBokeh({} as Window), 0); // no BokehJS in the page
  });
});

describe('watchTheme', () => {
  it('calls back when JupyterLab marks the body with another theme', async () => {
    const { window } = new JSDOM('<!doctype html><html><body data-jp-theme-light="true"></body></html>');
    let n = 0;
    const obs = watchTheme(window.document, () => n++);
    window.document.body.setAttribute('data-jp-theme-light', 'false');
    await new Promise(r => setTimeout(r, 0));
    assert.equal(n, 1);
    obs!.disconnect();
  });
});
