/**
 * The live widget in JupyterLab, for the keyboard, screen readers and the theme.
 *
 * - Keys: JupyterLab binds the arrow keys (and J, K, A, B, ...) to notebook commands on any
 *   focused element of a notebook in command mode that is not a text field, so ArrowDown on
 *   the GPU dropdown moved to the next cell. Lumino stops looking for a shortcut at an element
 *   marked `data-lm-suppress-shortcuts`: the widget's controls carry it, and keep their keys.
 * - Names: the batch slider's handle says the batch size (`aria-valuetext`), not the index of
 *   its preset; the charts (drawn on canvases) are a labelled figure described by the text the
 *   widget writes for them (`.xmem-chart-summary`).
 * - Theme: the charts read their colours from CSS custom properties when they paint; a theme
 *   change repaints them (`repaintBokeh`).
 *
 * Pure DOM, no JupyterLab imports: unit-tested under jsdom (test/access.test.ts).
 */

/** The widget's controls: they keep their own keys. */
const CONTROLS = 'select, input, textarea, button, [role="slider"], .noUi-handle, .widget-readout';

let ids = 0;

/** Mark the controls, name the slider's value and the charts; idempotent (runs on every change). */
export function decorateWidget(root: Element): void {
  for (const widget of Array.from(root.querySelectorAll('.xmem-widget'))) {
    for (const c of Array.from(widget.querySelectorAll(CONTROLS))) {
      if (!c.hasAttribute('data-lm-suppress-shortcuts')) {
        c.setAttribute('data-lm-suppress-shortcuts', 'true');
      }
    }
    for (const slider of Array.from(widget.querySelectorAll('.xmem-batch-slider'))) {
      const name = slider.querySelector('.widget-label')?.textContent?.trim() || 'batch size';
      const value = slider.querySelector('.widget-readout')?.textContent?.trim() ?? '';
      for (const handle of Array.from(slider.querySelectorAll('.noUi-handle, [role="slider"]'))) {
        setIfChanged(handle, 'aria-valuetext', value ? `${name} ${value}` : name);
        setIfChanged(handle, 'aria-label', `${name}, preset values`);
      }
    }
    const summary = widget.querySelector('.xmem-chart-summary .xmem-chart-text');
    const charts = widget.querySelector('.xmem-charts');
    if (summary && charts) {
      // one id for the charts' description, kept when the widget writes the text anew
      const id = charts.getAttribute('aria-describedby') || summary.id || `xmem-chart-text-${++ids}`;
      if (summary.id !== id) {
        summary.id = id;
      }
      setIfChanged(charts, 'role', 'figure');
      setIfChanged(charts, 'aria-label', 'tensor lifetimes and allocator memory over the step');
      setIfChanged(charts, 'aria-describedby', id);
    }
  }
}

function setIfChanged(el: Element, name: string, value: string): void {
  if (el.getAttribute(name) !== value) {
    el.setAttribute(name, value);
  }
}

/** What BokehJS exposes of its views (the page's `window.Bokeh`). */
interface IView {
  model?: { type?: string };
  child_views?: Iterable<IView>;
  renderer_views?: Map<unknown, IView>;
  request_paint?: () => void;
  rerender?: () => void;
}

/**
 * Paint every Bokeh figure again and re-render its legends: the colours come from CSS custom
 * properties read at paint time (xmem_jupyter/charts.py), so a theme change needs a repaint.
 * Returns the number of figures repainted.
 */
export function repaintBokeh(win: Window): number {
  const bokeh = (win as any).Bokeh;
  const index = bokeh?.index;
  if (!index) {
    return 0;
  }
  const roots: IView[] = index.roots ? Array.from(index.roots as Iterable<IView>) : Object.values(index);
  const seen = new Set<IView>();
  let painted = 0;
  const walk = (v: IView | undefined, depth: number): void => {
    if (!v || seen.has(v) || depth > 16) {
      return;
    }
    seen.add(v);
    const type = v.model?.type;
    if (type === 'Legend' && typeof v.rerender === 'function') {
      v.rerender();
    }
    if ((type === 'Figure' || type === 'Plot') && typeof v.request_paint === 'function') {
      v.request_paint();
      painted += 1;
    }
    for (const c of v.child_views ?? []) {
      walk(c, depth + 1);
    }
    for (const c of v.renderer_views?.values() ?? []) {
      walk(c, depth + 1);
    }
  };
  for (const r of roots) {
    walk(r, 0);
  }
  return painted;
}

/** Call `onChange` when JupyterLab's theme changes (it marks the body), until disconnected. */
export function watchTheme(doc: Document, onChange: () => void): MutationObserver | null {
  const Observer = (doc.defaultView as any)?.MutationObserver;
  if (!Observer || !doc.body) {
    return null;
  }
  const observer: MutationObserver = new Observer(() => onChange());
  observer.observe(doc.body, { attributes: true, attributeFilter: ['data-jp-theme-light', 'data-jp-theme-name'] });
  return observer;
}
