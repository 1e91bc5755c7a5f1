/**
 * One result per cell: the per-notebook renderer shows the live widget only while ipywidgets'
 * renderer really holds a view, and the saved report otherwise (jsdom, with a stand-in for the
 * notebook's registry and ipywidgets' renderer).
 */
import { strict as assert } from 'node:assert';
import { readFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { describe, it } from 'node:test';

import { JSDOM } from 'jsdom';

const ROOT = resolve(__dirname, '..', '..', '..');
const EXAMPLE = JSON.parse(readFileSync(join(ROOT, 'xmem_engine', 'data', 'report-examples', 'mlp-rtx4060.json'), 'utf8'));

const { window } = new JSDOM('<!doctype html><html><body></body></html>');
const g = globalThis as any;
const w = window as any;
for (const [k, v] of Object.entries({
  window, document: w.document, navigator: w.navigator, HTMLElement: w.HTMLElement, Element: w.Element,
  Node: w.Node, Event: w.Event, MouseEvent: w.MouseEvent, KeyboardEvent: w.KeyboardEvent,
  DragEvent: w.DragEvent ?? class DragEvent extends w.MouseEvent {}, MutationObserver: w.MutationObserver,
  getComputedStyle: w.getComputedStyle.bind(window),
  requestAnimationFrame: (cb: () => void) => setTimeout(cb, 0),
  cancelAnimationFrame: (id: ReturnType<typeof setTimeout>) => clearTimeout(id)
})) {
  Object.defineProperty(g, k, { value: v, configurable: true, writable: true });
}

// eslint-disable-next-line @typescript-eslint/no-var-requires
const { Panel, Widget } = require('@lumino/widgets');
// eslint-disable-next-line @typescript-eslint/no-var-requires
const live = require('../src/live');

const REPORT = 'application/vnd.xmem.report+json';
const VIEW = 'application/vnd.jupyter.widget-view+json';

/** ipywidgets' renderer as it behaves: text while it looks for the model, then the view as a
 * child widget, or "model not found" when the kernel has no such model. */
class FakeWidgetRenderer extends Panel {
  constructor(private models: Set<string>) {
    super();
  }
  async renderModel(model: any): Promise<void> {
    this.node.textContent = 'Loading widget...';
    await new Promise(r => setTimeout(r, 1));
    const id = model.data[VIEW].model_id;
    if (!this.models.has(id)) {
      this.node.textContent = 'Error displaying widget: model not found';
      return;
    }
    this.node.textContent = '';
    const view = new Widget();
    view.addClass('xmem-widget');
    this.addWidget(view);
  }
}

function registry(models: Set<string>, withWidgets = true) {
  const made: any[] = [];
  return {
    made,
    mimeTypes: withWidgets ? [VIEW, REPORT] : [REPORT],
    createRenderer(mime: string) {
      assert.equal(mime, VIEW);
      const r = new FakeWidgetRenderer(models);
      made.push(r);
      return r;
    }
  };
}

const OPTIONS = { mimeType: REPORT, sanitizer: {}, resolver: null, linkHandler: null, latexTypesetter: null };

function bundle(modelId: string | null, trusted = true) {
  const data: any = { [REPORT]: EXAMPLE, 'text/html': '<b>x</b>', 'text/plain': 'xmem: ...' };
  if (modelId !== null) data[VIEW] = { version_major: 2, version_minor: 0, model_id: modelId };
  return { trusted, data, metadata: {}, setData: () => undefined };
}

async function settle(): Promise<void> {
  await new Promise(r => setTimeout(r, 20));
}

function shown(r: any): { report: boolean; widget: boolean } {
  const report = r.node.querySelector('.jp-RenderedXmemReport');
  const view = r.node.querySelector('.xmem-live');
  return {
    report: !!report && !report.classList.contains('lm-mod-hidden'),
    widget: !!view && !view.classList.contains('lm-mod-hidden')
  };
}

describe('the per-notebook result renderer', () => {
  it('ranks ahead of ipywidgets (-10) and is safe for untrusted notebooks', () => {
    const f = live.liveFactory(registry(new Set()));
    assert.ok(f.defaultRank < -10);
    assert.equal(f.safe, true);
    assert.deepEqual(f.mimeTypes, [REPORT]);
  });

  it('shows the live widget, not the report, while the kernel holds its model', async () => {
    const reg = registry(new Set(['m1']));
    const r = live.liveFactory(reg).createRenderer(OPTIONS);
    await r.renderModel(bundle('m1'));
    await settle();
    assert.equal(r.showing, 'widget');
    assert.deepEqual(shown(r), { report: false, widget: true });
    // the widget's choice changes the report (update_display): the same view stays
    await r.renderModel(bundle('m1'));
    await settle();
    assert.equal(reg.made.length, 1);
    assert.equal(r.showing, 'widget');
    // the kernel goes: ipywidgets disposes the view; the report comes back
    reg.made[0].widgets[0].dispose();
    await settle();
    assert.deepEqual(shown(r), { report: true, widget: false });
  });

  it('shows the report, never "model not found", when the kernel has no such model', async () => {
    const r = live.liveFactory(registry(new Set())).createRenderer(OPTIONS);
    await r.renderModel(bundle('gone'));
    await settle();
    assert.equal(r.showing, 'report');
    assert.deepEqual(shown(r), { report: true, widget: false });
    assert.match(r.node.querySelector('.xmem-headline-text').textContent, /^Peak /);
  });

  it('asks again when the kernel restores the model late (a page reloaded on a busy machine)', async () => {
    const saved = { ...live.RETRIES };
    live.RETRIES.ms = 5;
    try {
      const models = new Set<string>();
      const reg = registry(models);
      const r = live.liveFactory(reg).createRenderer(OPTIONS);
      await r.renderModel(bundle('m1'));
      await settle();
      assert.equal(r.showing, 'report'); // "model not found": not shown
      models.add('m1'); // the manager has it now
      await new Promise(res => setTimeout(res, 60));
      assert.equal(r.showing, 'widget');
      assert.deepEqual(shown(r), { report: false, widget: true });
      assert.equal(r.node.querySelectorAll('.xmem-live').length, 1);
    } finally {
      Object.assign(live.RETRIES, saved);
    }
  });

  it('gives up after its tries, and stops at once when the kernel goes', async () => {
    const saved = { ...live.RETRIES };
    live.RETRIES.ms = 2;
    try {
      const reg = registry(new Set());
      const r = live.liveFactory(reg).createRenderer(OPTIONS);
      await r.renderModel(bundle('gone'));
      await new Promise(res => setTimeout(res, 80));
      assert.equal(reg.made.length, 1 + live.RETRIES.count);
      assert.deepEqual(shown(r), { report: true, widget: false });
      live.RETRIES.ms = 50;
      const reg2 = registry(new Set());
      const r2 = live.liveFactory(reg2).createRenderer(OPTIONS);
      await r2.renderModel(bundle('gone'));
      await settle(); // "model not found": a try is due in 50 ms
      r2.release();
      await new Promise(res => setTimeout(res, 200));
      assert.equal(reg2.made.length, 1);
    } finally {
      Object.assign(live.RETRIES, saved);
    }
  });

  it('never asks for the widget in an untrusted output, or without ipywidgets', async () => {
    for (const [reg, model] of [
      [registry(new Set(['m1'])), bundle('m1', false)],
      [registry(new Set(['m1']), false), bundle('m1')],
      [registry(new Set(['m1'])), bundle(null)]
    ] as const) {
      const r = live.liveFactory(reg).createRenderer(OPTIONS);
      await r.renderModel(model);
      await settle();
      assert.equal(reg.made.length, 0);
      assert.deepEqual(shown(r), { report: true, widget: false });
    }
  });

  it('starts the widget again when ipywidgets binds its factory to the manager (page reload)', async () => {
    // before the kernel session is ready the registry's widget renderers have no manager
    class Unbound extends Panel {
      async renderModel(): Promise<void> {
        this.node.textContent = 'Loading widget...';
      }
    }
    const models = new Set(['m1']);
    let factory: any = { mimeTypes: [VIEW], createRenderer: () => new Unbound() };
    const rendermime: any = {
      mimeTypes: [VIEW, REPORT],
      getFactory: (mime: string) => (mime === VIEW ? factory : undefined),
      createRenderer: (mime: string) => factory.createRenderer({ mimeType: mime }),
      addFactory: (f: any) => { factory = f; }
    };
    const watch = new live.FactoryWatch(rendermime);
    const r = live.liveFactory(rendermime, watch).createRenderer(OPTIONS);
    await r.renderModel(bundle('m1'));
    await settle();
    assert.equal(r.showing, 'report');
    rendermime.addFactory({ mimeTypes: [VIEW], createRenderer: () => new FakeWidgetRenderer(models) }, -10);
    await settle();
    assert.equal(r.showing, 'widget');
    assert.deepEqual(shown(r), { report: false, widget: true });
    assert.equal(r.node.querySelectorAll('.xmem-live').length, 1);
  });

  it('the plugin gives every notebook its own factory; a restarted kernel brings the reports back', async () => {
    const added: any[] = [];
    let ext: any = null;
    live.default.activate({ docRegistry: { addWidgetExtension: (name: string, e: any) => { assert.equal(name, 'Notebook'); ext = e; } } });
    const rendermime = { ...registry(new Set(['m1'])), addFactory: (f: any, rank: number) => added.push([f, rank]) };
    const slots: Record<string, (s: unknown, a: any) => void> = {};
    const signal = (name: string) => ({ connect: (fn: any) => { slots[name] = fn; return true; } });
    ext.createNew({ content: { rendermime }, sessionContext: { statusChanged: signal('status'), kernelChanged: signal('kernel') } }, {});
    assert.equal(added.length, 1);
    assert.equal(added[0][1], live.LIVE_RANK);
    const r = added[0][0].createRenderer(OPTIONS);
    await r.renderModel(bundle('m1'));
    await settle();
    assert.equal(r.showing, 'widget');
    slots.status(null, 'busy');
    assert.equal(r.showing, 'widget');
    slots.status(null, 'restarting');
    assert.deepEqual(shown(r), { report: true, widget: false });
    const r2 = added[0][0].createRenderer(OPTIONS);
    await r2.renderModel(bundle('m1'));
    await settle();
    slots.kernel(null, { oldValue: null, newValue: {} }); // the first kernel: nothing is gone
    assert.equal(r2.showing, 'widget');
    slots.kernel(null, { oldValue: {}, newValue: null }); // shut down
    assert.deepEqual(shown(r2), { report: true, widget: false });
  });
});

describe('the report the live widget carries', () => {
  it('is written into the output, so the saved notebook has what the widget showed last', async () => {
    const reg = registry(new Set(['m1']));
    const r = live.liveFactory(reg).createRenderer(OPTIONS);
    const saved: any[] = [];
    const model: any = bundle('m1');
    model.setData = (o: any) => {
      saved.push(o.data);
      model.data = o.data;
    };
    await r.renderModel(model);
    await settle();
    const carried = { ...EXAMPLE, gpu: 'H100-SXM-80GB' };
    const holder = document.createElement('div');
    holder.className = 'xmem-report-json';
    holder.textContent = JSON.stringify({ [REPORT]: carried, 'text/html': '<i>h100</i>', 'text/plain': 'xmem: h100',
                                          [VIEW]: { model_id: 'other' }, 'text/javascript': 'alert(1)' });
    reg.made[0].widgets[0].node.appendChild(holder);
    await settle();
    assert.equal(saved.length, 1);
    assert.equal(saved[0][REPORT].gpu, 'H100-SXM-80GB');
    assert.equal(saved[0]['text/plain'], 'xmem: h100');
    assert.equal(saved[0][VIEW].model_id, 'm1'); // the view stays the cell's
    assert.equal(saved[0]['text/javascript'], undefined); // only the report's own parts
    // the same report again: nothing to write
    holder.setAttribute('data-x', '1');
    holder.textContent = holder.textContent + '';
    await settle();
    assert.equal(saved.length, 1);
  });

  it('ignores what is not a report', () => {
    assert.equal(live.handedReport('not json'), null);
    assert.equal(live.handedReport('[1]'), null);
    assert.equal(live.handedReport(JSON.stringify({ 'text/html': '<b>x</b>' })), null);
    assert.deepEqual(Object.keys(live.handedReport(JSON.stringify({ [REPORT]: { version: 1 }, 'text/html': 3 }))), [REPORT]);
  });
});
