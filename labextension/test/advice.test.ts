/**
 * The saved report's "What would make it fit" section (src/advice.ts), against an example
 * report written by xmem (xmem_engine/data/report-examples/mlp-deep-rtx4060-advice.json).
 */
import { strict as assert } from 'node:assert';
import { readFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { describe, it } from 'node:test';

import { JSDOM } from 'jsdom';

import { leverVerdict, parseAdvice } from '../src/advice';
import { renderReport } from '../src/render';

const ROOT = resolve(__dirname, '..', '..', '..');
const EXAMPLE = join(ROOT, 'xmem_engine', 'data', 'report-examples', 'mlp-deep-rtx4060-advice.json');

function example(): any {
  return JSON.parse(readFileSync(EXAMPLE, 'utf8'));
}

function render(data: unknown): HTMLElement {
  const doc = new JSDOM('<!doctype html><html><body></body></html>').window.document;
  const node = renderReport(data, doc);
  doc.body.appendChild(node);
  return node;
}

describe('advice', () => {
  it('shows one row per lever, with the peak xmem measured and its verdict', () => {
    const data = example();
    const node = render(data);
    const rows = [...node.querySelectorAll('.xmem-advice-table tr.xmem-lever')];
    assert.equal(rows.length, data.advice.levers.length);
    const ckpt = rows.find(r => r.firstElementChild?.textContent === 'activation checkpointing');
    assert.ok(ckpt, 'no checkpointing row');
    const cells = [...ckpt.querySelectorAll('td')].map(td => td.textContent);
    const lever = data.advice.levers.find((l: any) => l.lever === 'activation checkpointing');
    assert.equal(cells[1], `${(lever.peak_device_bytes / 1024 ** 3).toFixed(2)} GiB`);
    assert.equal(cells[2], lever.fits ? 'fits' : 'does not fit');
    assert.ok(ckpt.querySelector(lever.fits ? '.xmem-lever-fits' : '.xmem-lever-nofit'));
    assert.match(node.querySelector('.xmem-section-title')?.textContent ?? '', /What would make it fit NVIDIA GeForce RTX 4060/);
  });

  it('names the cheapest change that fits, with the code to write', () => {
    const data = example();
    const node = render(data);
    assert.equal(node.querySelector('.xmem-combination')?.textContent, data.advice.combination.join(' + '));
    const code = [...node.querySelectorAll('.xmem-advice-verdict li code')].map(c => c.textContent);
    const first = data.advice.levers.find((l: any) => l.lever === data.advice.combination[0]);
    assert.deepEqual(code[0], first.change);
  });

  it('says why a lever was not measured, and keeps markup as text', () => {
    const data = example();
    data.advice.levers[0] = { ...data.advice.levers[0], lever: '<img src=x onerror=alert(1)>', error: 'RuntimeError: <b>no</b>', peak_device_bytes: null };
    data.advice.levers[1] = { ...data.advice.levers[1], applicable: false, peak_device_bytes: null, detail: 'no repeated blocks' };
    const node = render(data);
    assert.equal(node.querySelector('img'), null);
    assert.equal(node.querySelector('.xmem-advice-table b'), null);
    const rows = [...node.querySelectorAll('tr.xmem-lever')];
    assert.equal(rows[0].firstElementChild?.textContent, '<img src=x onerror=alert(1)>');
    assert.equal(rows[0].querySelectorAll('td')[2].textContent, 'not measured: RuntimeError: <b>no</b>');
    assert.equal(rows[1].querySelectorAll('td')[2].textContent, 'n/a: no repeated blocks');
  });

  it('leaves the section out when the report has no advice or cannot be read', () => {
    const data = example();
    delete data.advice;
    assert.equal(render(data).querySelector('.xmem-advice'), null);
    assert.equal(parseAdvice({ levers: 'x' }), null);
    assert.equal(parseAdvice(null), null);
    assert.equal(leverVerdict({ lever: 'a', change: '', cost: '', peak_device_bytes: 1, fits: false, applicable: true, detail: '', error: '' }), 'does not fit');
  });

  it('says when the step fits already', () => {
    const data = example();
    data.advice.fits = true;
    assert.match(render(data).querySelector('.xmem-advice-verdict')?.textContent ?? '', /fits already/);
  });

  it('says how "cheapest" is judged when xmem wrote it (the report\'s advice.ranking)', () => {
    const data = example();
    assert.equal(render(data).querySelector('.xmem-ranking'), null); // an older report: nothing made up
    const ranking = 'Ranked by cost, cheapest first.';
    const node = render({ ...data, advice: { ...data.advice, ranking } });
    assert.equal(node.querySelector('.xmem-advice .xmem-ranking')!.textContent, ranking);
  });
});
