/**
 * "What would make it fit" in a saved report: the report's `advice` (written by
 * `Advice.to_json()` in xmem_engine/advisor.py; schema: report.schema.json, `advice`) as a
 * table of the levers, cheapest first, and the cheapest change that fits, with its code.
 * The same words as the widget's panel (xmem_jupyter/advice.py: advice_html).
 */

import { el, formatGiB, isNum, isObject, str } from './format';

export interface LeverResult {
  lever: string;
  change: string;
  cost: string;
  /** null: not applicable here, or not measured (then `error` says why) */
  peak_device_bytes: number | null;
  fits: boolean;
  applicable: boolean;
  detail: string;
  error: string;
}

export interface Advice {
  gpu_name: string;
  capacity_bytes: number;
  peak_device_bytes: number;
  fits: boolean;
  alloc_conf: string;
  batch_var: string | null;
  batch: number | null;
  levers: LeverResult[];
  combination: string[];
  combination_peak_bytes: number | null;
  /** How the table is ordered and "cheapest" judged (xmem_jupyter/advice.py, RANKING). */
  ranking: string;
}

/** The report's `advice`, or null when it has none or it cannot be read. */
export function parseAdvice(v: unknown): Advice | null {
  if (!isObject(v) || !Array.isArray(v.levers) || !isNum(v.capacity_bytes) || !isNum(v.peak_device_bytes)) {
    return null;
  }
  const levers: LeverResult[] = [];
  for (const l of v.levers) {
    if (isObject(l) && typeof l.lever === 'string') {
      levers.push({
        lever: l.lever,
        change: str(l.change),
        cost: str(l.cost),
        peak_device_bytes: isNum(l.peak_device_bytes) ? l.peak_device_bytes : null,
        fits: l.fits === true,
        applicable: l.applicable !== false,
        detail: str(l.detail),
        error: str(l.error)
      });
    }
  }
  return {
    gpu_name: str(v.gpu_name) || str(v.gpu),
    capacity_bytes: v.capacity_bytes,
    peak_device_bytes: v.peak_device_bytes,
    fits: v.fits === true,
    alloc_conf: str(v.alloc_conf),
    batch_var: typeof v.batch_var === 'string' ? v.batch_var : null,
    batch: isNum(v.batch) ? v.batch : null,
    levers,
    combination: Array.isArray(v.combination) ? v.combination.map(n => str(n)) : [],
    combination_peak_bytes: isNum(v.combination_peak_bytes) ? v.combination_peak_bytes : null,
    ranking: str(v.ranking)
  };
}

/** The verdict column: what the measurement found, in the widget's words. */
export function leverVerdict(l: LeverResult): string {
  if (l.error) {
    return `not measured: ${l.error}`;
  }
  if (!l.applicable || l.peak_device_bytes === null) {
    return `n/a: ${l.detail}`;
  }
  return (l.fits ? 'fits' : 'does not fit') + (l.detail ? ` (${l.detail})` : '');
}

export function renderAdvice(a: Advice, doc: Document): HTMLElement {
  const section = el(doc, 'div', 'xmem-section xmem-advice');
  const setting: string[] = [];
  if (a.batch_var && a.batch !== null) {
    setting.push(`${a.batch_var} = ${a.batch}`);
  }
  if (a.alloc_conf) {
    setting.push(`PYTORCH_CUDA_ALLOC_CONF=${a.alloc_conf}`);
  }
  section.appendChild(el(doc, 'div', 'xmem-section-title', `What would make it fit ${a.gpu_name}`));
  section.appendChild(
    el(
      doc,
      'div',
      'xmem-advice-head',
      `${formatGiB(a.capacity_bytes)}: the step as written peaks at ${formatGiB(a.peak_device_bytes)}` +
        (setting.length ? ` (${setting.join(', ')})` : '') +
        '; each change below was applied to this step and estimated again'
    )
  );
  const table = el(doc, 'table', 'xmem-table xmem-advice-table');
  const head = el(doc, 'tr');
  for (const h of ['change', 'peak device memory', 'verdict', 'cost', 'how']) {
    const th = el(doc, 'th', undefined, h);
    th.setAttribute('scope', 'col');
    head.appendChild(th);
  }
  table.appendChild(head);
  for (const l of a.levers) {
    const measured = !l.error && l.applicable && l.peak_device_bytes !== null;
    const row = el(doc, 'tr', 'xmem-lever');
    row.appendChild(el(doc, 'td', undefined, l.lever));
    row.appendChild(el(doc, 'td', 'xmem-num', measured ? formatGiB(l.peak_device_bytes as number) : ''));
    row.appendChild(el(doc, 'td', measured ? (l.fits ? 'xmem-lever-fits' : 'xmem-lever-nofit') : 'xmem-lever-na', leverVerdict(l)));
    row.appendChild(el(doc, 'td', undefined, l.cost));
    const how = el(doc, 'td');
    how.appendChild(el(doc, 'code', undefined, l.change));
    row.appendChild(how);
    table.appendChild(row);
  }
  section.appendChild(table);
  if (a.ranking) {
    section.appendChild(el(doc, 'div', 'xmem-ranking', a.ranking));
  }
  const verdict = el(doc, 'div', 'xmem-advice-verdict');
  if (a.fits) {
    verdict.textContent = 'The step fits already; the table shows what each change would save.';
  } else if (a.combination.length) {
    verdict.appendChild(el(doc, 'b', undefined, 'Cheapest change that fits: '));
    verdict.appendChild(el(doc, 'span', 'xmem-combination', a.combination.join(' + ')));
    if (a.combination_peak_bytes !== null) {
      verdict.appendChild(doc.createTextNode(` (peak ${formatGiB(a.combination_peak_bytes)})`));
    }
    const ul = el(doc, 'ul');
    for (const name of a.combination) {
      const l = a.levers.find(x => x.lever === name);
      const li = el(doc, 'li', undefined, `${name}: `);
      li.appendChild(el(doc, 'code', undefined, l ? l.change : ''));
      ul.appendChild(li);
    }
    verdict.appendChild(ul);
  } else {
    verdict.appendChild(
      el(doc, 'span', 'xmem-lever-nofit', 'No change or combination measured here makes it fit: ')
    );
    verdict.appendChild(doc.createTextNode('a larger GPU, or sharding over several.'));
  }
  section.appendChild(verdict);
  return section;
}
