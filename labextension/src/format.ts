/**
 * Formatting and DOM helpers shared by the report renderer (render.ts) and the advice panel
 * (advice.ts): numbers printed as Python prints them, and elements whose text is only ever
 * set with `textContent`.
 */

export const GIB = 1024 ** 3;

/**
 * `bytes / unit` with two decimals, rounding as Python's `f"{x:.2f}"` does (the exact
 * value, ties to even), so the renderer prints what the CLI and the widget print.
 * `unit` is a power of two, so `bytes * 100 / unit` is exact for any byte count < 2**46.
 */
export function fixed2(bytes: number, unit = 1): string {
  const sign = bytes < 0 ? '-' : '';
  const q = (Math.abs(bytes) * 100) / unit;
  let n = Math.floor(q);
  const frac = q - n;
  if (frac > 0.5 || (frac === 0.5 && n % 2 === 1)) {
    n += 1;
  }
  const cents = String(n % 100).padStart(2, '0');
  return `${n === 0 ? '' : sign}${Math.floor(n / 100)}.${cents}`;
}

/** Bytes as GiB with two decimals, e.g. "3.21 GiB" (the headline's unit). */
export function formatGiB(bytes: number): string {
  return `${fixed2(bytes, GIB)} GiB`;
}

/** Bytes in the largest binary unit that keeps the number >= 1, e.g. "177.35 MiB". */
export function formatBytes(bytes: number): string {
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let u = 0;
  while (Math.abs(bytes) >= 1024 ** (u + 1) && u < units.length - 1) {
    u += 1;
  }
  return u === 0 ? `${bytes} B` : `${fixed2(bytes, 1024 ** u)} ${units[u]}`;
}

export function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

export function isNum(v: unknown): v is number {
  return typeof v === 'number' && Number.isFinite(v);
}

export function str(v: unknown, fallback = ''): string {
  if (typeof v === 'string') {
    return v;
  }
  if (v === null || v === undefined) {
    return fallback;
  }
  return String(v);
}

/** An element with a class and text (never parsed as HTML). */
export function el<K extends keyof HTMLElementTagNameMap>(
  doc: Document,
  tag: K,
  className?: string,
  text?: string
): HTMLElementTagNameMap[K] {
  const node = doc.createElement(tag);
  if (className) {
    node.className = className;
  }
  if (text !== undefined) {
    node.textContent = text;
  }
  return node;
}
