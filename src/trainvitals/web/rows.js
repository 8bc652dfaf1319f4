// Tables updated in place: a live page redraws its rows every few seconds, and a cell left
// alone keeps a selection of its text, the keyboard's focus and anything holding on to it.

// Brings a drawn row to the cells wanted (each cell's HTML), replacing only the cells whose
// HTML changed.
export function syncCells(row, cells) {
  const drawn = row.drawnCells ?? [];
  if (drawn.length !== cells.length || row.cells.length !== cells.length) {
    row.innerHTML = cells.join("");
  } else {
    const fresh = document.createElement("tr");
    fresh.innerHTML = cells.map((cell, i) => (cell === drawn[i] ? "<td></td>" : cell)).join("");
    const replacements = [...fresh.cells];
    cells.forEach((cell, i) => { if (cell !== drawn[i]) row.cells[i].replaceWith(replacements[i]); });
  }
  row.drawnCells = cells;
}

// Puts the rows wanted into the table's body in order, moving only those out of place and
// removing the rest.
export function syncRows(body, rows) {
  const wanted = new Set(rows);
  for (const child of [...body.children]) if (!wanted.has(child)) child.remove();
  rows.forEach((row, i) => { if (body.children[i] !== row) body.insertBefore(row, body.children[i] ?? null); });
}
