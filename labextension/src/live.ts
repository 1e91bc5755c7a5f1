/**
 * One result per `%%xmem` cell: the live widget while its kernel holds it, else the saved report.
 *
 * The magic writes one output whose bundle holds both the widget's view
 * (`application/vnd.jupyter.widget-view+json`) and the static report
 * (`application/vnd.xmem.report+json`, with `text/html` and `text/plain` for other front ends).
 * JupyterLab shows one MIME type per output; ipywidgets' renderer alone would show "Error
 * displaying widget: model not found" once the kernel is gone. This renderer is added to each
 * notebook's own registry ahead of ipywidgets' (rank -20 < -10) and shows the report at once,
 * while it asks that registry's widget renderer (the one bound to the notebook's widget manager)
 * for the live view in a hidden child. It shows the widget only once the view is really there,
 * and the report again if the view goes (kernel restarted or shut down). Untrusted outputs never
 * reach the widget renderer: the report is all they show.
 *
 * The report follows the widget (another GPU, batch size, the advice measured): the kernel
 * cannot update the output itself from a widget's callback (JupyterLab routes display updates
 * only to the cell that is executing), so the widget carries its current report in a hidden
 * element (`.xmem-report-json`, JSON as text) and this renderer writes it into the output's
 * data, which the notebook then saves.
 */
import { IRenderMime } from '@jupyterlab/rendermime-interfaces';
import { Panel, Widget } from '@lumino/widgets';

import { decorateWidget, repaintBokeh, watchTheme } from './access';
import { REPORT_MIME, renderReport } from './render';

export const WIDGET_MIME = 'application/vnd.jupyter.widget-view+json';

/** The parts of the output the widget's report hand-off may replace; nothing else. */
const HANDED = [REPORT_MIME, 'text/html', 'text/plain'];

/**
 * The report the live widget carries (`.xmem-report-json` in its view), as output data to
 * merge: an object report and string HTML / text only, or null.
 */
export function handedReport(text: string): Record<string, unknown> | null {
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch {
    return null;
  }
  if (typeof parsed !== 'object' || parsed === null || Array.isArray(parsed)) {
    return null;
  }
  const given = parsed as Record<string, unknown>;
  const report = given[REPORT_MIME];
  if (typeof report !== 'object' || report === null || Array.isArray(report)) {
    return null;
  }
  const out: Record<string, unknown> = {};
  for (const key of HANDED) {
    const v = given[key];
    if (key === REPORT_MIME ? typeof v === 'object' && v !== null : typeof v === 'string') {
      out[key] = v;
    }
  }
  return out;
}

/** The rank of the per-notebook factory: ahead of ipywidgets' widget renderer (-10). */
export const LIVE_RANK = -20;

/** What this renderer needs of a notebook's `IRenderMimeRegistry`. */
export interface IWidgetSource {
  readonly mimeTypes: ReadonlyArray<string>;
  createRenderer(mimeType: string): IRenderMime.IRenderer;
  getFactory?(mimeType: string): IRenderMime.IRendererFactory | undefined;
}

/**
 * ipywidgets binds its widget renderers to the notebook's widget manager only once the
 * kernel session is ready: it then replaces the registry's widget factory, and hands the
 * manager to the renderers it finds directly in the output area. Ours holds its widget
 * renderer one level down, where ipywidgets does not look, so the registry's `addFactory` is
 * followed and our renderers start again with the new factory (a page reloaded while the
 * kernel runs shows its widgets again).
 */
export class FactoryWatch {
  private readonly _renderers = new Set<XmemResultRenderer>();

  constructor(registry: IWidgetSource & { addFactory(f: IRenderMime.IRendererFactory, rank?: number): void }) {
    const add = registry.addFactory.bind(registry);
    registry.addFactory = (f: IRenderMime.IRendererFactory, rank?: number): void => {
      add(f, rank);
      if (f.mimeTypes.includes(WIDGET_MIME)) {
        for (const r of Array.from(this._renderers)) {
          r.refresh();
        }
      }
    };
  }

  add(r: XmemResultRenderer): void {
    this._renderers.add(r);
    r.disposed.connect(() => this._renderers.delete(r));
  }

  /** The kernel restarted, died or went: its widgets are dead; every output shows its report. */
  kernelGone(): void {
    for (const r of Array.from(this._renderers)) {
      r.release();
    }
  }
}

const CLASS_NAME = 'jp-RenderedXmemResult';

/**
 * When ipywidgets answers "model not found", the live view is asked again, this many times,
 * waiting `ms` times the try's number first. A page reloaded against a running kernel restores
 * the widget models from it while each view waits 2 s for its own; on a busy machine a view
 * loses that race and its model arrives later. A kernel that really lacks the model (restarted)
 * costs a few hidden tries; the report shows throughout.
 */
export const RETRIES = { count: 3, ms: 2000 };

/** True when ipywidgets' renderer holds a view (it adds the view as a child widget). */
function holdsView(live: Widget): boolean {
  const children = (live as Panel).widgets;
  return Array.isArray(children) ? children.length > 0 : false;
}

export class XmemResultRenderer extends Panel implements IRenderMime.IRenderer {
  private readonly _source: IWidgetSource | null;
  private readonly _report: Widget;
  private _live: Widget | null = null;
  private _liveFactory: unknown = null;
  private _model: IRenderMime.IMimeModel | null = null;
  private _modelId = '';
  private _observer: MutationObserver | null = null;
  private _handed = '';
  private _tries = 0;
  private _retry: ReturnType<typeof setTimeout> | null = null;

  constructor(options: IRenderMime.IRendererOptions, source: IWidgetSource | null) {
    super();
    this._source = source;
    this.addClass(CLASS_NAME);
    this._report = new Widget();
    this._report.addClass('jp-RenderedXmemReport');
    this.addWidget(this._report);
  }

  /** Which of the two is on screen: 'widget' or 'report' (for tests and styling). */
  get showing(): 'widget' | 'report' {
    return this._live !== null && holdsView(this._live) ? 'widget' : 'report';
  }

  async renderModel(model: IRenderMime.IMimeModel): Promise<void> {
    const doc = this.node.ownerDocument;
    this._report.node.replaceChildren(renderReport(model.data[REPORT_MIME], doc));
    const view = model.data[WIDGET_MIME] as { model_id?: unknown } | undefined;
    const id = model.trusted && view && typeof view.model_id === 'string' ? view.model_id : '';
    this._model = model;
    if (id !== this._modelId) {
      this._dropLive();
      this._cancelRetry();
      this._tries = 0;
      this._modelId = id;
      this._startLive();
    }
    this._sync();
  }

  /** Start the live widget again if the registry's widget factory changed (see FactoryWatch). */
  refresh(): void {
    if (this.isDisposed || !this._modelId || this.showing === 'widget') {
      return;
    }
    if (this._source?.getFactory?.(WIDGET_MIME) !== this._liveFactory) {
      this._dropLive();
      this._startLive();
      this._sync();
    }
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this._cancelRetry();
    this._dropLive();
    super.dispose();
  }

  /** Show the report and let go of the widget (its kernel is gone). */
  release(): void {
    this._cancelRetry();
    this._dropLive();
    this._sync();
  }

  private _startLive(): void {
    const model = this._model;
    if (!this._modelId || model === null || !this._source || !this._source.mimeTypes.includes(WIDGET_MIME)) {
      return;
    }
    let live: IRenderMime.IRenderer;
    try {
      this._liveFactory = this._source.getFactory?.(WIDGET_MIME) ?? null;
      live = this._source.createRenderer(WIDGET_MIME);
    } catch (err) {
      console.warn('xmem: no widget renderer; showing the saved report', err);
      return;
    }
    this._live = live;
    live.addClass('xmem-live');
    live.hide(); // "Loading widget..." / "model not found" are never shown: the report is
    this.addWidget(live);
    const Observer = (this.node.ownerDocument.defaultView as any)?.MutationObserver ?? MutationObserver;
    this._observer = new Observer(() => {
      this._sync();
      this._takeReport();
      decorateWidget(live.node);
      this._retryIfNotFound(live);
    });
    this._observer!.observe(live.node, { childList: true, subtree: true, characterData: true });
    live.renderModel(model).then(
      () => this._sync(),
      err => console.warn('xmem: the live widget did not render; showing the saved report', err)
    );
  }

  /** Ask for the live view again later if ipywidgets did not find its model (see RETRIES). */
  private _retryIfNotFound(live: Widget): void {
    if (this._retry !== null || this._tries >= RETRIES.count || this.showing === 'widget') {
      return;
    }
    if (!(live.node.textContent ?? '').includes('model not found')) {
      return;
    }
    this._tries += 1;
    this._retry = setTimeout(() => {
      this._retry = null;
      if (this.isDisposed || this._live !== live) {
        return; // released, or started again meanwhile
      }
      this._dropLive();
      this._startLive();
      this._sync();
    }, RETRIES.ms * this._tries);
  }

  private _cancelRetry(): void {
    if (this._retry !== null) {
      clearTimeout(this._retry);
      this._retry = null;
    }
  }

  /** The report the live widget carries, into the output's data (saved with the notebook). */
  private _takeReport(): void {
    const model = this._model;
    const node = this._live?.node.querySelector('.xmem-report-json');
    const text = node?.textContent ?? '';
    if (!model || !text || text === this._handed) {
      return;
    }
    this._handed = text;
    const data = handedReport(text);
    if (data && JSON.stringify(data[REPORT_MIME]) !== JSON.stringify(model.data[REPORT_MIME])) {
      model.setData({ data: { ...model.data, ...data } as any });
    }
  }

  private _dropLive(): void {
    this._observer?.disconnect();
    this._observer = null;
    if (this._live !== null) {
      this._live.dispose();
      this._live = null;
    }
  }

  private _sync(): void {
    const widget = this.showing === 'widget';
    if (this._live !== null) {
      this._live.setHidden(!widget);
    }
    this._report.setHidden(widget);
  }
}

/** The factory one notebook's registry gets: its renderers find the widget renderer there. */
export function liveFactory(source: IWidgetSource, watch?: FactoryWatch): IRenderMime.IRendererFactory {
  return {
    safe: true,
    mimeTypes: [REPORT_MIME],
    defaultRank: LIVE_RANK,
    createRenderer: options => {
      const r = new XmemResultRenderer(options, source);
      watch?.add(r);
      return r;
    }
  };
}

// The few pieces of JupyterLab's application API the plugin uses, declared here so that the
// extension keeps depending on @jupyterlab/rendermime-interfaces alone.
interface ISignalLike<T> {
  connect(slot: (sender: unknown, args: T) => void): boolean;
}

interface INotebookPanelLike {
  content: { rendermime: IWidgetSource & { addFactory(f: IRenderMime.IRendererFactory, rank?: number): void } };
  sessionContext?: {
    statusChanged: ISignalLike<string>;
    kernelChanged: ISignalLike<{ oldValue: unknown; newValue: unknown }>;
  };
}

/** Statuses after which a kernel's widget models are gone. */
const GONE = new Set(['restarting', 'autorestarting', 'dead']);

interface IAppLike {
  docRegistry: {
    addWidgetExtension(
      widgetName: string,
      extension: { createNew(panel: INotebookPanelLike, context: unknown): void }
    ): unknown;
  };
}

/** Adds the live renderer to every notebook's registry as the notebook is created. */
const plugin = {
  id: 'xmem-jupyter:live-result',
  description: 'Shows the live xmem widget while its kernel holds it, else the saved report.',
  autoStart: true,
  activate: (app: IAppLike): void => {
    // the charts paint with the theme's colours: paint them again when it changes (its
    // stylesheet arrives a moment after the body says so)
    watchTheme(document, () => {
      for (const ms of [50, 400, 1500]) {
        setTimeout(() => repaintBokeh(window), ms);
      }
    });
    app.docRegistry.addWidgetExtension('Notebook', {
      createNew(panel: INotebookPanelLike): void {
        const registry = panel.content.rendermime;
        const watch = new FactoryWatch(registry);
        registry.addFactory(liveFactory(registry, watch), LIVE_RANK);
        const session = panel.sessionContext;
        session?.statusChanged.connect((_, status) => {
          if (GONE.has(status)) {
            watch.kernelGone();
          }
        });
        session?.kernelChanged.connect((_, change) => {
          if (change.oldValue) {
            watch.kernelGone(); // another kernel, or none: the old one's widgets are gone
          }
        });
      }
    });
  }
};

export default plugin;
