/**
 * The JupyterLab side: the MIME extension's declaration and its widget, under jsdom, and a
 * scan of the sources for HTML-parsing APIs (the renderer is marked safe for untrusted
 * notebooks, so it must never turn data into markup).
 */
import { strict as assert } from 'node:assert';
import { readdirSync, readFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { describe, it } from 'node:test';

import { JSDOM } from 'jsdom';

const ROOT = resolve(__dirname, '..', '..', '..');
const SRC = join(ROOT, 'labextension', 'src');
const EXAMPLES = join(ROOT, 'xmem_engine', 'data', 'report-examples');

// Lumino reads browser globals when it loads: give it jsdom's (jsdom has no DragEvent).
const { window } = new JSDOM('<!doctype html><html><body></body></html>');
const g = globalThis as any;
const w = window as any;
const browserGlobals: Record<string, unknown> = {
  window,
  document: w.document,
  navigator: w.navigator,
  HTMLElement: w.HTMLElement,
  Element: w.Element,
  Node: w.Node,
  Event: w.Event,
  MouseEvent: w.MouseEvent,
  KeyboardEvent: w.KeyboardEvent,
  DragEvent: w.DragEvent ?? class DragEvent extends w.MouseEvent {},
  getComputedStyle: w.getComputedStyle.bind(window),
  requestAnimationFrame: (cb: () => void) => setTimeout(cb, 0),
  cancelAnimationFrame: (id: ReturnType<typeof setTimeout>) => clearTimeout(id)
};
for (const [k, v] of Object.entries(browserGlobals)) {
  Object.defineProperty(g, k, { value: v, configurable: true, writable: true });
}

// eslint-disable-next-line @typescript-eslint/no-var-requires
const ext = require('../src/index');

describe('the MIME extension', () => {
  const extension = ext.default;

  it('renders application/vnd.xmem.report+json, safely, ahead of text/plain', () => {
    assert.equal(extension.id, 'xmem-jupyter:report');
    assert.deepEqual(extension.rendererFactory.mimeTypes, ['application/vnd.xmem.report+json']);
    assert.equal(extension.rendererFactory.safe, true);
    assert.equal(extension.rank, 0);
    assert.equal(extension.dataType, 'json');
  });

  it('its widget renders a saved report from the model', async () => {
    const widget = extension.rendererFactory.createRenderer({
      mimeType: 'application/vnd.xmem.report+json',
      sanitizer: {},
      resolver: null,
      linkHandler: null,
      latexTypesetter: null
    });
    const data = JSON.parse(readFileSync(join(EXAMPLES, 'mlp-rtx4060.json'), 'utf8'));
    await widget.renderModel({ trusted: false, data: { 'application/vnd.xmem.report+json': data, 'text/plain': 'x' }, metadata: {}, setData: () => undefined });
    assert.ok(widget.node.classList.contains('jp-RenderedXmemReport'));
    assert.match(widget.node.querySelector('.xmem-headline-text').textContent, /^Peak 0\.62 GiB of 7\.75 GiB/);
    assert.ok(widget.node.querySelector('svg.xmem-chart'));
    // rendering again replaces, never appends
    await widget.renderModel({ trusted: false, data: { 'application/vnd.xmem.report+json': { version: 99 } }, metadata: {}, setData: () => undefined });
    assert.equal(widget.node.children.length, 1);
    assert.match(widget.node.textContent, /format version 99/);
  });
});

describe('the sources never parse HTML', () => {
  const files = readdirSync(SRC).filter(f => f.endsWith('.ts'));
  const forbidden = [/\binnerHTML\b/, /\bouterHTML\b/, /\binsertAdjacentHTML\b/, /\bdocument\.write/, /\bDOMParser\b/, /\bcreateContextualFragment\b/, /\beval\s*\(/, /\bnew Function\b/, /\bsetAttribute\(\s*['"]on/, /\bsrcdoc\b/];
  for (const f of files) {
    it(f, () => {
      const code = readFileSync(join(SRC, f), 'utf8')
        .replace(/\/\*[\s\S]*?\*\//g, '')
        .replace(/^\s*\/\/.*$/gm, '');
      for (const re of forbidden) {
        assert.ok(!re.test(code), `${f} uses ${re}`);
      }
    });
  }
});
