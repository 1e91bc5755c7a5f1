/**
 * xmem-jupyter: a MIME renderer for saved xmem estimates.
 *
 * The `%%xmem` magic writes one output holding its widget's view and a static
 * `application/vnd.xmem.report+json` report. Widgets need their kernel; this renderer needs
 * nothing but the saved data, so a reopened notebook still shows the estimate (in JupyterLab
 * and Notebook 7). In notebooks, `live.ts` adds the renderer that picks between the two.
 *
 * `safe: true`: the renderer is meant to run in untrusted notebooks. It builds its DOM with
 * `textContent` and DOM APIs only (src/render.ts), never parsing HTML from the data, and
 * runs no code from it.
 */
import { IRenderMime } from '@jupyterlab/rendermime-interfaces';
import { Widget } from '@lumino/widgets';

import { REPORT_MIME, renderReport } from './render';

export { REPORT_MIME };

const CLASS_NAME = 'jp-RenderedXmemReport';

/** The output widget: re-renders from the model's data each time the model changes. */
export class XmemReportRenderer extends Widget implements IRenderMime.IRenderer {
  private _mimeType: string;

  constructor(options: IRenderMime.IRendererOptions) {
    super();
    this._mimeType = options.mimeType;
    this.addClass(CLASS_NAME);
  }

  renderModel(model: IRenderMime.IMimeModel): Promise<void> {
    const data = model.data[this._mimeType];
    this.node.replaceChildren(renderReport(data, this.node.ownerDocument));
    return Promise.resolve();
  }
}

export const rendererFactory: IRenderMime.IRendererFactory = {
  safe: true,
  mimeTypes: [REPORT_MIME],
  defaultRank: 0,
  createRenderer: options => new XmemReportRenderer(options)
};

const extension: IRenderMime.IExtension = {
  id: 'xmem-jupyter:report',
  description: 'Renders saved xmem GPU-memory estimates without a kernel.',
  rendererFactory,
  rank: 0,
  dataType: 'json'
};

export default extension;
