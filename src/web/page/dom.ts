/** Small DOM helpers for the account page. Every element it needs is in index.html, so a missing one is a bug that fails loudly. */

/** The element with this id, checked to be of the expected type. */
export function byId<T extends HTMLElement>(id: string, type: abstract new () => T): T {
  const element = document.getElementById(id);
  if (!(element instanceof type)) throw new Error(`account page: #${id} is missing or not a ${type.name}`);
  return element;
}

/** A table row; strings become text (nothing the service sends is ever parsed as HTML), cells are kept as they are. */
export function row(cells: Array<string | Node>): HTMLTableRowElement {
  const tr = document.createElement("tr");
  for (const content of cells) {
    if (content instanceof HTMLTableCellElement) {
      tr.append(content);
      continue;
    }
    const td = document.createElement("td");
    td.append(content);
    tr.append(td);
  }
  return tr;
}

/** The one row of an empty table: a sentence across all its columns. */
export function emptyRow(table: HTMLTableElement, text: string): HTMLTableRowElement {
  const tr = document.createElement("tr");
  const td = document.createElement("td");
  td.colSpan = table.tHead?.rows[0]?.cells.length ?? 1;
  td.textContent = text;
  tr.append(td);
  return tr;
}

/** A right-aligned cell for a figure. */
export function numberCell(text: string): HTMLTableCellElement {
  const td = document.createElement("td");
  td.className = "num";
  td.textContent = text;
  return td;
}

/** A `<time>` with a readable UTC stamp and the exact instant in its datetime attribute. */
export function timeElement(date: Date | undefined, empty = "never"): Node {
  if (!date) return document.createTextNode(empty);
  const time = document.createElement("time");
  time.dateTime = date.toISOString();
  time.textContent = formatUtc(date);
  return time;
}

/** "2026-11-26 07:05 UTC": one format everywhere, whatever the reader's locale. */
export function formatUtc(date: Date): string {
  return `${date.toISOString().slice(0, 16).replace("T", " ")} UTC`;
}

/** Credits with up to six decimals (the ledger's unit is a millionth of a credit), no trailing zeros. */
export function formatCredits(credits: number): string {
  return credits.toLocaleString("en-US", { minimumFractionDigits: 0, maximumFractionDigits: 6 });
}

/** A size as people read it: bytes, KiB or MiB (the upload's bound is stated in MiB). */
export function formatBytes(bytes: number): string {
  if (bytes < 1024) return `${bytes} bytes`;
  if (bytes < 1024 * 1024) return `${(bytes / 1024).toFixed(1)} KiB`;
  return `${(bytes / (1024 * 1024)).toFixed(1)} MiB`;
}

/** Time left as "45 s", "3 min 20 s" or "2 h 5 min". */
export function formatSeconds(seconds: number): string {
  const s = Math.ceil(seconds);
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
  return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
}

/** A key as people recognise it: its key prefix (`ts_live_`, what the account API sends of its start), an ellipsis and its last four characters. */
export function keyLabel(keyPrefix: string, last4: string): string {
  return `${keyPrefix}…${last4}`;
}
