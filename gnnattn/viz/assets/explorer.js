// gnnattn attention explorer: the page logic. Data come from the JSON block
// written by gnnattn.viz.explore; drawing is on <canvas> (an SVG element per
// edge does not scale to 100k edges), with d3 for zoom/pan, hit-testing of
// nodes (quadtree), colour scales and DOM updates.
(function () {
  "use strict";
  const D = JSON.parse(document.getElementById("gnnattn-data").textContent);
  const EDGE = "#1f77b4";
  const HILITE = "#d62728";
  const MAX_WIDTH = D.maxWidth; // px of an edge of weight 1
  const OPACITY_FLOOR = D.opacityFloor; // so that faint edges stay visible
  const LEVELS = 256; // edges are stroked in 256 weight levels, one path each
  const ARROWS_UP_TO = 3000; // arrowheads only while they can be told apart
  const TABLE_ROWS = 64;
  const STRUCTURE = "#8c8c8c"; // the given structure (bonds): neutral, under the attention
  const STRUCTURE_WIDTH = 2;
  const STRUCTURE_MARK = "#f28e2b"; // its matrix cells: seen on white and on dark blue

  // ------------------------------------------------------------------ data
  function decode(s, Type) {
    const bin = atob(s);
    const bytes = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
    return new Type(bytes.buffer);
  }
  // Where each character as a reader sees it starts (UTF-16 offsets, then the
  // length): a cut there never splits a surrogate pair (an emoji), a ZWJ
  // sequence, a flag, or a letter from its accents. Intl.Segmenter where the
  // browser has it, code points otherwise; once per distinct label.
  const segmenter = typeof Intl !== "undefined" && Intl.Segmenter
    ? new Intl.Segmenter(undefined, { granularity: "grapheme" }) : null;
  const boundaryCache = new Map();
  function boundaries(text) {
    let b = boundaryCache.get(text);
    if (b === undefined) {
      const out = [];
      if (segmenter) { for (const seg of segmenter.segment(text)) out.push(seg.index); }
      else { let k = 0; for (const c of text) { out.push(k); k += c.length; } }
      out.push(text.length);
      b = Int32Array.from(out);
      boundaryCache.set(text, b);
    }
    return b;
  }
  // At most MAX_LABEL code points (and an ellipsis), cut where a character
  // starts, as gnnattn.viz.text.shorten cuts (one longer character, such as a
  // letter under thousands of marks, is cut inside).
  function capLabel(text) {
    if (text.length <= MAX_LABEL) return text; // UTF-16 units >= code points
    let k = 0, n = 0;
    for (const c of text) { if (n === MAX_LABEL) break; k += c.length; n++; }
    if (k === text.length) return text;
    // The characters around the cut: 64 more units show whether k starts one.
    const b = boundaries(text.slice(0, k + 64));
    let cut = 0;
    for (let m = 0; m < b.length && b[m] <= k; m++) cut = b[m];
    return text.slice(0, cut > 0 ? cut : k) + "\u2026";
  }
  // At most n characters: the first n - 1 and an ellipsis when it is longer.
  function shortText(text, n) {
    const b = boundaries(text);
    return b.length - 1 > n ? text.slice(0, b[n - 1]) + "\u2026" : text;
  }

  const N = D.n;
  const IDX = D.idx === "u16" ? Uint16Array : Int32Array;
  // Labels come cut to D.maxLabel code points and an ellipsis
  // (gnnattn.viz.text.shorten); one longer is cut here too (capLabel, above),
  // since a browser measures a long run of combining marks or of Arabic in
  // seconds, not microseconds.
  const MAX_LABEL = (D.maxLabel || 200) + 1;
  const labels = D.labels.map(capLabel);
  const ids = D.ids; // original node ids of a neighbourhood, or null
  // Node fill by class (node_color): Tableau10, a rainbow beyond 10 classes,
  // lightened so that the black label stays readable.
  const groups = D.groups;
  const groupColor = groups ? groups.names.map(function (_, k) {
    const c = groups.names.length <= 10 ? d3.schemeTableau10[k] : d3.interpolateRainbow(k / groups.names.length);
    return d3.interpolateRgb(c, "#fff")(0.3);
  }) : null;
  const wx = decode(D.x, Float32Array);
  const wy = decode(D.y, Float32Array); // screen orientation: y grows downwards
  const layers = D.layers.map(function (L) {
    const src = decode(L.src, IDX);
    const rowptr = decode(L.rowptr, Int32Array);
    const E = src.length;
    const dst = new Int32Array(E);
    let maxDeg = 0;
    for (let i = 0; i < N; i++) {
      maxDeg = Math.max(maxDeg, rowptr[i + 1] - rowptr[i]);
      for (let e = rowptr[i]; e < rowptr[i + 1]; e++) dst[e] = i;
    }
    return {
      name: L.name, H: L.heads, E: E, src: src, dst: dst, rowptr: rowptr, maxDeg: maxDeg,
      alpha: decode(L.alpha, Float32Array), // [H, E], head-major
      scores: L.scores ? decode(L.scores, Float32Array) : null,
      amax: decode(L.amax, Float32Array), // [H, N]: max alpha of each full row
      asum: decode(L.asum, Float32Array),
      smax: L.smax ? decode(L.smax, Float32Array) : null, // [H, N]: m_i
      ssum: L.ssum ? decode(L.ssum, Float32Array) : null, // [H, N]: sum exp(s - m_i)
      degree: decode(L.degree, Int32Array), // [N]: incoming edges of each full row
      cutRows: L.cutRows ? decode(L.cutRows, Uint8Array) : null, // [N]: 1 where max_edges cut
      note: L.note,
      derived: new Map(),
    };
  });

  // The given structure (structure=edge_index): unordered pairs a < b, drawn
  // as straight lines under the attention edges; keys of both orders j * N + i.
  const structure = D.structure ? {
    a: decode(D.structure.a, IDX), b: decode(D.structure.b, IDX), count: D.structure.count,
  } : null;
  const structureKeys = new Set();
  if (structure) {
    for (let k = 0; k < structure.count; k++) {
      structureKeys.add(structure.a[k] * N + structure.b[k]);
      structureKeys.add(structure.b[k] * N + structure.a[k]);
    }
  }
  function isStructure(j, i) { return structureKeys.has(j * N + i); }

  const S = { layer: 0, head: 0, topk: 1, minw: 0, focus: -1, hover: null, structure: !!structure };

  function cur() { return layers[S.layer]; }

  function weightsOf(L, h) {
    if (h >= 0) return L.alpha.subarray(h * L.E, (h + 1) * L.E);
    const key = "mean";
    if (!L.derived.has(key)) {
      const m = new Float32Array(L.E);
      for (let hh = 0; hh < L.H; hh++) {
        const a = L.alpha.subarray(hh * L.E, (hh + 1) * L.E);
        for (let e = 0; e < L.E; e++) m[e] += a[e];
      }
      for (let e = 0; e < L.E; e++) m[e] /= L.H;
      L.derived.set(key, m);
    }
    return L.derived.get(key);
  }

  // Rank of each edge among its target's incoming edges, heaviest first (ties:
  // edge order), per head; computed once per head when first shown.
  function rankOf(L, h) {
    const key = "rank" + h;
    if (!L.derived.has(key)) {
      const w = weightsOf(L, h);
      const order = new Int32Array(L.E);
      for (let e = 0; e < L.E; e++) order[e] = e;
      const rank = new Int32Array(L.E);
      for (let i = 0; i < N; i++) {
        const a = L.rowptr[i], b = L.rowptr[i + 1];
        if (b - a < 2) { if (b > a) rank[a] = 0; continue; }
        const seg = order.subarray(a, b);
        seg.sort(function (p, q) { return w[q] - w[p] || p - q; });
        for (let r = 0; r < seg.length; r++) rank[seg[r]] = r;
      }
      L.derived.set(key, rank);
    }
    return L.derived.get(key);
  }

  function findEdge(L, j, i) {
    // Sources are sorted within a target: binary search the row.
    let lo = L.rowptr[i], hi = L.rowptr[i + 1] - 1;
    while (lo <= hi) {
      const mid = (lo + hi) >> 1;
      if (L.src[mid] < j) lo = mid + 1;
      else if (L.src[mid] > j) hi = mid - 1;
      else return findFirst(L, mid, j, i); // duplicates: the first of them
    }
    return -1;
  }
  function findFirst(L, e, j, i) {
    while (e > L.rowptr[i] && L.src[e - 1] === j) e--;
    return e;
  }
  // Edge e and its duplicates (same source, same target; adjacent, rows are
  // sorted by source): [first, end). Each sends its own message, so the
  // cell's weight is their sum, as in attention_matrix.
  function runOf(L, e) {
    const j = L.src[e], i = L.dst[e];
    let end = e + 1;
    while (end < L.rowptr[i + 1] && L.src[end] === j) end++;
    return [findFirst(L, e, j, i), end];
  }
  // Calls cell(j, i, sum, shown) once per matrix cell with an edge: the sum
  // of its edges' weights w, and whether any of them is shown.
  function eachCell(L, w, cell) {
    for (let e = 0; e < L.E;) {
      const end = runOf(L, e)[1];
      let sum = 0, shown = false;
      for (let k = e; k < end; k++) { sum += w[k]; shown = shown || vis[k] === 1; }
      cell(L.src[e], L.dst[e], sum, shown);
      e = end;
    }
  }

  // Incoming edges written for target i, and in the whole layer: fewer where
  // a neighbourhood's border or max_edges cut the row.
  function rowCount(L, i) { return { kept: L.rowptr[i + 1] - L.rowptr[i], full: L.degree[i] }; }

  // -------------------------------------------------------------- visibility
  let vis = new Uint8Array(0);
  let drawn = new Int32Array(0); // visible edges, lightest first
  let levelStart = new Int32Array(LEVELS + 1);

  function level(w) { return Math.min(LEVELS - 1, Math.max(0, Math.round(w * (LEVELS - 1)))); }

  function computeVisible() {
    const L = cur();
    const w = weightsOf(L, S.head);
    const rank = rankOf(L, S.head);
    const k = S.topk, mw = S.minw, f = S.focus;
    if (vis.length !== L.E) vis = new Uint8Array(L.E);
    const counts = new Int32Array(LEVELS + 1);
    let n = 0;
    for (let e = 0; e < L.E; e++) {
      const on = rank[e] < k && w[e] >= mw && (f < 0 || L.dst[e] === f);
      vis[e] = on ? 1 : 0;
      if (on) { counts[level(w[e]) + 1]++; n++; }
    }
    for (let l = 0; l < LEVELS; l++) counts[l + 1] += counts[l];
    levelStart = counts.slice();
    drawn = new Int32Array(n);
    const fill = counts;
    for (let e = 0; e < L.E; e++) if (vis[e]) drawn[fill[level(w[e])]++] = e;
    document.body.dataset.drawn = String(n);
    const status = n + " of " + L.E + " edges drawn" +
      (S.focus >= 0 ? " (incoming edges of " + labelOf(S.focus) + ")" : "");
    d3.select("#status").text(status).attr("title", status); // whole, where it is cut short
  }

  // ---------------------------------------------------------------- geometry
  const graphStack = document.getElementById("graph-stack");
  const gCanvas = document.getElementById("graph");
  const gOver = document.getElementById("graph-overlay");
  const dpr = window.devicePixelRatio || 1;
  let GW = 0, GH = 0;
  let fit = { s: 1, ox: 0, oy: 0 };
  let T = d3.zoomIdentity;
  const sx = new Float64Array(N), sy = new Float64Array(N);
  let nodeR0 = 8; // node radius in px at zoom 1
  const rad = D.rad; // arc bend, in screen orientation
  let centreX = 0, centreY = 0;

  function sizeCanvas(c, w, h) {
    c.width = Math.round(w * dpr); c.height = Math.round(h * dpr);
    c.style.width = w + "px"; c.style.height = h + "px";
  }

  // Nodes with a self-loop in some layer: the loops are drawn outside the
  // node, and the fitted box holds them whichever layer is shown.
  const looped = (function () {
    const seen = new Uint8Array(N), out = [];
    for (const L of layers) {
      for (let e = 0; e < L.E; e++) {
        const i = L.dst[e];
        if (L.src[e] === i && !seen[i]) { seen[i] = 1; out.push(i); }
      }
    }
    return out;
  })();
  const FIT_PAD = 8; // px between the drawing and the canvas's edge

  function computeFit() {
    GW = Math.max(200, graphStack.clientWidth);
    GH = Math.max(200, graphStack.clientHeight);
    sizeCanvas(gCanvas, GW, GH); sizeCanvas(gOver, GW, GH);
    const box = worldBox();
    centreX = (box.x0 + box.x1) / 2; centreY = (box.y0 + box.y1) / 2;
    const w = Math.max(box.x1 - box.x0, 1e-9), h = Math.max(box.y1 - box.y0, 1e-9);
    const flat = box.x1 - box.x0 < 1e-9 && box.y1 - box.y0 < 1e-9;
    const spacing = nodeSpacing(), need = labelNeed();
    // The nodes and loops take px whatever the scale, and the node radius
    // follows the scale: a few rounds settle both (the scale only shrinks).
    let s = flat ? 1 : Math.min((GW - 2 * FIT_PAD) / w, (GH - 2 * FIT_PAD) / h);
    let o = null;
    for (let round = 0; round < 4; round++) {
      nodeR0 = radiusAt(s, spacing, need);
      o = overhang(box, s, nodeR0);
      if (flat) break;
      const s1 = Math.min(Math.max(1, GW - 2 * FIT_PAD - o.l - o.r) / w,
        Math.max(1, GH - 2 * FIT_PAD - o.t - o.b) / h);
      if (s1 >= s * 0.999) break;
      s = s1;
    }
    fit = { s: s,
      ox: GW / 2 - (box.x0 * s - o.l + box.x1 * s + o.r) / 2,
      oy: GH / 2 - (box.y0 * s - o.t + box.y1 * s + o.b) / 2 };
  }

  // The box around the nodes and the apexes of the arcs of the first layer, in layout units.
  function worldBox() {
    let x0 = Infinity, x1 = -Infinity, y0 = Infinity, y1 = -Infinity;
    function take(x, y) { if (x < x0) x0 = x; if (x > x1) x1 = x; if (y < y0) y0 = y; if (y > y1) y1 = y; }
    for (let i = 0; i < N; i++) take(wx[i], wy[i]);
    const L = layers[0];
    for (let e = 0; e < L.E; e++) {
      const j = L.src[e], i = L.dst[e];
      if (i === j) continue;
      const dx = wx[i] - wx[j], dy = wy[i] - wy[j];
      take((wx[i] + wx[j]) / 2 + rad * dy / 2, (wy[i] + wy[j]) / 2 - rad * dx / 2);
    }
    if (!isFinite(x0)) { x0 = y0 = -1; x1 = y1 = 1; }
    return { x0: x0, x1: x1, y0: y0, y1: y1 };
  }

  // The median distance from a node to its nearest other node, in layout
  // units (null below two nodes).
  function nodeSpacing() {
    if (N < 2) return null;
    const pts = [];
    for (let i = 0; i < N; i++) pts.push([wx[i], wy[i]]);
    const qt = d3.quadtree().addAll(pts), nn = [];
    for (const p of pts) {
      qt.remove(p);
      const q = qt.find(p[0], p[1]);
      qt.add(p);
      if (q) nn.push(Math.hypot(q[0] - p[0], q[1] - p[1]));
    }
    nn.sort(function (a, b) { return a - b; });
    return nn.length ? nn[nn.length >> 1] : null;
  }

  // The radius the longest label at 10 px needs (at most 30 px).
  function labelNeed() {
    const probe = gCanvas.getContext("2d");
    probe.font = "10px system-ui, sans-serif";
    let widest = 0;
    for (let i = 0; i < Math.min(N, 2000); i++) widest = Math.max(widest, probe.measureText(labels[i]).width);
    return Math.min(30, widest / (2 * 0.84) + 1);
  }

  // Node radius at scale s: 0.4 of the median distance to the nearest other
  // node, up to 16 px, or as wide as the longest label needs (at most 30 px)
  // where the nodes are far enough apart: "river" is read whole.
  function radiusAt(s, spacing, need) {
    const med = spacing === null ? 40 : spacing * s;
    return Math.max(2, Math.min(Math.max(16, need), 0.4 * med));
  }

  // How far the drawing reaches past the box scaled by s, in px on each side:
  // the node circles with their hover ring, and the self-loops with their
  // widest stroke (a loop's far side is 2.36 radii out from its node).
  function overhang(box, s, r) {
    const o = { l: 0, r: 0, t: 0, b: 0 };
    function disc(x, y, ext) {
      o.l = Math.max(o.l, ext - (x - box.x0 * s)); o.r = Math.max(o.r, x + ext - box.x1 * s);
      o.t = Math.max(o.t, ext - (y - box.y0 * s)); o.b = Math.max(o.b, y + ext - box.y1 * s);
    }
    for (let i = 0; i < N; i++) disc(wx[i] * s, wy[i] * s, r + 4);
    const loop = loopShape(r), stroke = MAX_WIDTH / 2 + 1;
    for (const i of looped) {
      const d = loopDir(i);
      disc(wx[i] * s + d[0] * loop.offset, wy[i] * s + d[1] * loop.offset, loop.radius + stroke);
    }
    return o;
  }

  function project() {
    for (let i = 0; i < N; i++) {
      sx[i] = T.k * (wx[i] * fit.s + fit.ox) + T.x;
      sy[i] = T.k * (wy[i] * fit.s + fit.oy) + T.y;
    }
  }
  function nodeR() { return Math.min(40, nodeR0 * T.k); }

  // Control point of edge e's quadratic arc, in screen px.
  function control(j, i) {
    const dx = sx[i] - sx[j], dy = sy[i] - sy[j];
    return [(sx[i] + sx[j]) / 2 + rad * dy, (sy[i] + sy[j]) / 2 - rad * dx];
  }
  // A self-loop: a circle just outside the node, away from the centre.
  function loopOf(i) {
    const loop = loopShape(nodeR()), d = loopDir(i);
    return [sx[i] + d[0] * loop.offset, sy[i] + d[1] * loop.offset, loop.radius];
  }
  // A loop of a node of radius r: its circle's radius and its centre's distance from the node's.
  function loopShape(r) { return { radius: 0.8 * r, offset: r + 0.7 * 0.8 * r }; }
  // Where node i's loop goes: below a layered row, else away from the centre
  // (zooming and panning scale the picture alike: the same direction).
  function loopDir(i) {
    if (D.layout === "layered") return [0, 1];
    const dx = wx[i] - centreX, dy = wy[i] - centreY, nrm = Math.hypot(dx, dy);
    return nrm > 1e-9 ? [dx / nrm, dy / nrm] : [0, -1];
  }

  function tracePath(ctx, e) {
    const L = cur();
    const j = L.src[e], i = L.dst[e];
    if (i === j) {
      const c = loopOf(i);
      ctx.moveTo(c[0] + c[2], c[1]);
      ctx.arc(c[0], c[1], c[2], 0, 2 * Math.PI);
      return;
    }
    const c = control(j, i);
    ctx.moveTo(sx[j], sy[j]);
    ctx.quadraticCurveTo(c[0], c[1], sx[i], sy[i]);
  }

  function traceArrow(ctx, e, size) {
    const L = cur();
    const j = L.src[e], i = L.dst[e];
    if (i === j) return;
    const c = control(j, i);
    let dx = sx[i] - c[0], dy = sy[i] - c[1];
    const nrm = Math.hypot(dx, dy) || 1;
    dx /= nrm; dy /= nrm;
    const r = nodeR();
    const tx = sx[i] - dx * r, ty = sy[i] - dy * r;
    ctx.moveTo(tx, ty);
    ctx.lineTo(tx - dx * size - dy * size * 0.5, ty - dy * size + dx * size * 0.5);
    ctx.lineTo(tx - dx * size + dy * size * 0.5, ty - dy * size - dx * size * 0.5);
    ctx.closePath();
  }

  function widthOf(w) { return Math.max(MAX_WIDTH * w, 0.5); }
  function opacityOf(w) { return Math.min(1, Math.max(w, OPACITY_FLOOR)); }

  // In running text a label is isolated (FSI ... PDI), so that a right-to-left
  // label does not reorder the quotes and the id around it.
  function labelOf(i) { return "'\u2068" + labels[i] + "\u2069' (" + (ids ? ids[i] : i) + ")"; }

  // ------------------------------------------------------------------ drawing
  let structureDrawn = 0, structureMarked = 0; // lines and matrix cells drawn, for the tests
  function drawGraph() {
    const ctx = gCanvas.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, GW, GH);
    project();
    structureDrawn = 0;
    if (structure && S.structure) { // first: under every attention edge
      ctx.globalAlpha = 1; ctx.strokeStyle = STRUCTURE; ctx.lineWidth = STRUCTURE_WIDTH;
      ctx.lineCap = "round";
      ctx.beginPath();
      for (let k = 0; k < structure.count; k++) {
        const a = structure.a[k], b = structure.b[k];
        ctx.moveTo(sx[a], sy[a]); ctx.lineTo(sx[b], sy[b]);
      }
      ctx.stroke();
      structureDrawn = structure.count;
    }
    document.body.dataset.structure = String(structureDrawn);
    ctx.strokeStyle = EDGE; ctx.fillStyle = EDGE;
    ctx.lineCap = "round";
    const arrows = drawn.length <= ARROWS_UP_TO;
    for (let l = 0; l < LEVELS; l++) {
      const a = levelStart[l], b = levelStart[l + 1];
      if (a === b) continue;
      const w = l / (LEVELS - 1);
      ctx.globalAlpha = opacityOf(w);
      ctx.lineWidth = widthOf(w);
      ctx.beginPath();
      for (let k = a; k < b; k++) tracePath(ctx, drawn[k]);
      ctx.stroke();
      if (arrows) {
        ctx.beginPath();
        for (let k = a; k < b; k++) traceArrow(ctx, drawn[k], 5 + 1.5 * widthOf(w));
        ctx.fill();
      }
    }
    ctx.globalAlpha = 1;
    const r = nodeR();
    ctx.lineWidth = r > 4 ? 1.2 : 0.6;
    ctx.strokeStyle = "#000";
    const fills = groupColor || ["#fff"];
    for (let g = 0; g < fills.length; g++) { // one path per class colour
      ctx.fillStyle = fills[g];
      ctx.beginPath();
      for (let i = 0; i < N; i++) {
        if (groups && groups.of[i] !== g) continue;
        ctx.moveTo(sx[i] + r, sy[i]); ctx.arc(sx[i], sy[i], r, 0, 2 * Math.PI);
      }
      ctx.fill(); ctx.stroke();
    }
    labelFit = 0;
    if (r >= 5) { // a label fits from here on (a character at least)
      ctx.fillStyle = "#000"; ctx.textAlign = "center"; ctx.textBaseline = "middle";
      for (let i = 0; i < N; i++) {
        const fit = fitLabel(ctx, labels[i], r);
        ctx.font = fit.font;
        if (fit.height > 2 * LABEL_ROOM * r) { // a stack of marks: kept inside its circle
          ctx.save();
          ctx.beginPath(); ctx.arc(sx[i], sy[i], r, 0, 2 * Math.PI); ctx.clip();
          ctx.fillText(fit.text, sx[i], sy[i]);
          ctx.restore();
        } else ctx.fillText(fit.text, sx[i], sy[i]);
        labelFit = Math.max(labelFit, fit.width / (2 * r));
      }
    }
  }

  // The label in the largest font (8 to 13 px) that fits inside the circle,
  // measured, not estimated; shortened with an ellipsis when even 8 px is too wide.
  const LABEL_ROOM = 0.84; // of the diameter: the text's box stays inside the circle
  let labelFit = 0; // widest drawn label / diameter, for the tests
  let measured = 0; // measureText calls of fitLabel, for the tests
  function measure(ctx, text) { measured++; return ctx.measureText(text); }
  function heightOf(m) { return (m.actualBoundingBoxAscent || 0) + (m.actualBoundingBoxDescent || 0); }
  function fitLabel(ctx, text, r) {
    const room = LABEL_ROOM * 2 * r;
    let fs = Math.min(13, Math.max(8, 0.85 * r));
    ctx.font = fs.toFixed(1) + "px system-ui, sans-serif";
    let m = measure(ctx, text), w = m.width;
    while (w > room && fs > 8) { // glyphs do not scale exactly: shrink until it fits
      fs = Math.max(8, 0.97 * fs * room / w);
      ctx.font = fs.toFixed(1) + "px system-ui, sans-serif";
      m = measure(ctx, text); w = m.width;
    }
    if (w <= room) return { text: text, font: ctx.font, width: w, height: heightOf(m) };
    // Too wide even at 8 px: the most characters that fit with an ellipsis,
    // found by bisection on the cut (a longer prefix is never narrower), so
    // log2(L) measurements of a label of L characters, not L.
    const b = boundaries(text);
    let lo = 1, hi = b.length - 2; // keep lo..hi characters (never all of them)
    let shown = null, shownM = null;
    while (lo <= hi) {
      const mid = (lo + hi) >> 1;
      const t = text.slice(0, b[mid]) + "\u2026";
      const tm = measure(ctx, t);
      if (tm.width <= room) { shown = t; shownM = tm; lo = mid + 1; } else hi = mid - 1;
    }
    if (shown === null) { shown = text.slice(0, b[1]); shownM = measure(ctx, shown); } // one character
    return { text: shown, font: ctx.font, width: shownM.width, height: heightOf(shownM) };
  }

  function drawOverlay() {
    const ctx = gOver.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, GW, GH);
    const L = cur();
    const r = nodeR();
    function ring(i, color) {
      ctx.strokeStyle = color; ctx.lineWidth = 2.5;
      ctx.beginPath(); ctx.arc(sx[i], sy[i], r + 2, 0, 2 * Math.PI); ctx.stroke();
    }
    if (S.focus >= 0) ring(S.focus, HILITE);
    const h = S.hover;
    if (h && h.edge >= 0) {
      ctx.strokeStyle = HILITE; ctx.fillStyle = HILITE; ctx.globalAlpha = 0.9;
      ctx.lineWidth = Math.max(2.5, widthOf(weightsOf(L, S.head)[h.edge]));
      ctx.beginPath(); tracePath(ctx, h.edge); ctx.stroke();
      ctx.beginPath(); traceArrow(ctx, h.edge, 9); ctx.fill();
      ctx.globalAlpha = 1;
      ring(L.src[h.edge], "#ff7f0e"); ring(L.dst[h.edge], HILITE);
    } else if (h && h.node >= 0) {
      ring(h.node, "#ff7f0e");
    }
  }

  // Matrix: one pixel per cell in an N x N image, scaled up without smoothing.
  const mStack = document.getElementById("matrix-stack");
  const mCanvas = document.getElementById("matrix");
  const mOver = document.getElementById("matrix-overlay");
  const mImage = document.createElement("canvas");
  let M = { size: 0, left: 0, top: 0, cell: 1, labels: false, on: N > 0 && !D.matrixNote };
  const blues = new Uint8Array(LEVELS * 3);
  const pale = new Uint8Array(LEVELS * 3);
  for (let l = 0; l < LEVELS; l++) {
    const c = d3.rgb(d3.interpolateBlues(l / (LEVELS - 1)));
    blues[3 * l] = c.r; blues[3 * l + 1] = c.g; blues[3 * l + 2] = c.b;
    // Hidden by a filter: the same colour, three quarters of the way to white.
    pale[3 * l] = 255 - (255 - c.r) / 4; pale[3 * l + 1] = 255 - (255 - c.g) / 4;
    pale[3 * l + 2] = 255 - (255 - c.b) / 4;
  }

  function layoutMatrix() {
    const width = Math.max(300, Math.min(460, document.getElementById("side").clientWidth || 440));
    M.labels = N <= 48;
    const margin = M.labels ? 64 : 6;
    M.cell = N ? (width - margin - 6) / N : 1;
    if (M.labels) M.cell = Math.floor(M.cell);
    M.left = margin; M.top = margin;
    M.size = M.left + M.cell * N + 6;
    mStack.style.height = (M.on ? M.size : 40) + "px";
    if (D.matrixNote) mStack.style.display = "none"; // the note above says why
    sizeCanvas(mCanvas, M.size, M.on ? M.size : 40); sizeCanvas(mOver, M.size, M.on ? M.size : 40);
    mImage.width = Math.max(1, N); mImage.height = Math.max(1, N);
  }

  function drawMatrix() {
    const ctx = mCanvas.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, M.size, M.size);
    if (!M.on) {
      ctx.fillStyle = "#777"; ctx.font = "12px system-ui, sans-serif";
      if (!N) ctx.fillText("no nodes", 8, 24);
      return;
    }
    const L = cur();
    const w = weightsOf(L, S.head);
    const ictx = mImage.getContext("2d");
    const img = ictx.createImageData(N, N);
    const px = img.data;
    for (let p = 0; p < px.length; p += 4) { px[p] = 221; px[p + 1] = 221; px[p + 2] = 221; px[p + 3] = 255; }
    eachCell(L, w, function (j, i, sum, shown) {
      const p = 4 * (i * N + j);
      const l = 3 * level(sum);
      const lut = shown ? blues : pale;
      px[p] = lut[l]; px[p + 1] = lut[l + 1]; px[p + 2] = lut[l + 2];
    });
    ictx.putImageData(img, 0, 0);
    ctx.imageSmoothingEnabled = false;
    ctx.drawImage(mImage, M.left, M.top, M.cell * N, M.cell * N);
    structureMarked = 0;
    if (structure && S.structure) {
      // A structure edge: a corner triangle in both of its cells (j, i) and
      // (i, j), off the centre where the weight is written.
      const t = Math.max(1.5, Math.min(9, 0.4 * M.cell));
      ctx.fillStyle = STRUCTURE_MARK;
      ctx.beginPath();
      for (let k = 0; k < structure.count; k++) {
        const a = structure.a[k], b = structure.b[k];
        for (const [i, j] of [[a, b], [b, a]]) {
          const x = M.left + j * M.cell, y = M.top + i * M.cell;
          ctx.moveTo(x, y); ctx.lineTo(x + t, y); ctx.lineTo(x, y + t); ctx.closePath();
          structureMarked++;
        }
      }
      ctx.fill();
    }
    if (M.labels) {
      ctx.fillStyle = "#222"; ctx.font = Math.min(11, Math.max(7, M.cell)) + "px system-ui, sans-serif";
      ctx.textBaseline = "middle";
      for (let i = 0; i < N; i++) {
        const t = shortText(labels[i], 9);
        // A label taller than its row (a stack of combining marks) is kept in
        // its row, and in its column's band, instead of covering the others.
        const m = ctx.measureText(t);
        const tall = m.actualBoundingBoxAscent + m.actualBoundingBoxDescent > 1.5 * Math.max(M.cell, 8);
        ctx.textAlign = "right";
        ctx.save();
        if (tall) { ctx.beginPath(); ctx.rect(0, M.top + i * M.cell, M.left, M.cell); ctx.clip(); }
        ctx.fillText(t, M.left - 4, M.top + (i + 0.5) * M.cell);
        ctx.restore();
        ctx.save();
        ctx.translate(M.left + (i + 0.5) * M.cell, M.top - 4);
        ctx.rotate(-Math.PI / 3); ctx.textAlign = "left";
        if (tall) { ctx.beginPath(); ctx.rect(-2, -0.43 * M.cell, 2 * M.top, 0.86 * M.cell); ctx.clip(); }
        ctx.fillText(t, 0, 0);
        ctx.restore();
      }
      if (N <= 12) {
        ctx.textAlign = "center"; ctx.font = "10px system-ui, sans-serif";
        eachCell(L, w, function (j, i, sum) {
          ctx.fillStyle = sum > 0.6 ? "#fff" : "#000";
          ctx.fillText(sum.toFixed(2), M.left + (j + 0.5) * M.cell, M.top + (i + 0.5) * M.cell);
        });
      }
    }
  }

  function drawMatrixOverlay() {
    const ctx = mOver.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, M.size, M.size);
    if (!M.on) return;
    const L = cur();
    const c = Math.max(M.cell, 3);
    ctx.lineWidth = 2;
    if (S.focus >= 0) {
      ctx.strokeStyle = HILITE;
      ctx.strokeRect(M.left - 1, M.top + S.focus * M.cell - 1, M.cell * N + 2, Math.max(M.cell, 1) + 2);
    }
    const h = S.hover;
    if (h && h.cell) {
      const x = M.left + (h.cell[1] + 0.5) * M.cell, y = M.top + (h.cell[0] + 0.5) * M.cell;
      ctx.strokeStyle = "rgba(214, 39, 40, 0.35)"; ctx.lineWidth = 1;
      ctx.beginPath();
      ctx.moveTo(M.left, y); ctx.lineTo(M.left + M.cell * N, y);
      ctx.moveTo(x, M.top); ctx.lineTo(x, M.top + M.cell * N);
      ctx.stroke();
      ctx.strokeStyle = HILITE; ctx.lineWidth = 2;
      ctx.strokeRect(x - c / 2 - 1, y - c / 2 - 1, c + 2, c + 2);
    }
  }

  function drawLegend() {
    const c = document.getElementById("legend-lines");
    const ctx = c.getContext("2d");
    ctx.clearRect(0, 0, c.width, c.height);
    ctx.font = "11px system-ui, sans-serif"; ctx.fillStyle = "#222"; ctx.textBaseline = "middle";
    [1, 0.5, 0.1, 0.01].forEach(function (w, k) {
      const x = 6 + k * 82;
      ctx.strokeStyle = EDGE; ctx.globalAlpha = opacityOf(w); ctx.lineWidth = widthOf(w);
      ctx.beginPath(); ctx.moveTo(x, 17); ctx.lineTo(x + 30, 17); ctx.stroke();
      ctx.globalAlpha = 1; ctx.fillText("\u03b1 = " + w, x + 34, 17);
    });
    d3.select("#legend-text").text("width = " + MAX_WIDTH + " px \u00d7 \u03b1, opacity = \u03b1 (at least " +
      OPACITY_FLOOR + "); the weights are never rescaled");
    const cb = document.getElementById("colorbar");
    const cctx = cb.getContext("2d");
    cctx.clearRect(0, 0, cb.width, cb.height);
    for (let x = 0; x < 300; x++) {
      cctx.fillStyle = d3.interpolateBlues(x / 299); cctx.fillRect(60 + x, 4, 1, 12);
    }
    cctx.strokeStyle = "#999"; cctx.strokeRect(60, 4, 300, 12);
    cctx.fillStyle = "#222"; cctx.font = "11px system-ui, sans-serif"; cctx.textBaseline = "top";
    cctx.textAlign = "right"; cctx.fillText("\u03b1", 52, 4);
    cctx.textAlign = "center";
    [0, 0.25, 0.5, 0.75, 1].forEach(function (v) { cctx.fillText(String(v), 60 + 300 * v, 18); });
  }

  // The classes of node_color: a swatch, the name and how many nodes.
  function drawNodeLegend() {
    if (!groups) return;
    const box = d3.select("#node-legend").attr("hidden", null);
    const count = new Array(groups.names.length).fill(0);
    for (const g of groups.of) count[g]++;
    const MAX_SHOWN = 40;
    groups.names.slice(0, MAX_SHOWN).forEach(function (name, g) {
      const item = box.append("span").attr("class", "group").attr("data-group", g);
      item.append("span").attr("class", "swatch").style("background", groupColor[g]);
      item.append("span").text(name + " (" + count[g] + ")");
    });
    if (groups.names.length > MAX_SHOWN) box.append("span").text("\u2026 " + (groups.names.length - MAX_SHOWN) + " more classes");
  }

  // ------------------------------------------------------------------ numbers
  function fmt(x) {
    if (x === Infinity) return "inf";
    if (x === -Infinity) return "\u2212inf";
    if (x !== x) return "NaN";
    if (x === 0) return "0";
    const a = Math.abs(x);
    return (a >= 1e-3 && a < 1e5) ? x.toPrecision(4) : x.toExponential(3);
  }

  // What the softmax of target i did, for head h (h >= 0), edge by edge.
  function rowFacts(L, h, i) {
    const a = L.alpha.subarray(h * L.E, (h + 1) * L.E);
    const amax = L.amax[h * N + i], asum = L.asum[h * N + i];
    if (L.scores) {
      // known: a row whose scores are all -inf (m_i = -inf) has no max to subtract.
      const m = L.smax[h * N + i];
      return { scored: true, known: m > -Infinity, m: m, sum: L.ssum[h * N + i], asum: asum,
        s: function (e) { return L.scores[h * L.E + e]; },
        shifted: function (e) { return L.scores[h * L.E + e] - L.smax[h * N + i]; }, a: a };
    }
    // Without scores, s - m_i is still known exactly: alpha = exp(s - m) / Z
    // gives ln alpha - ln max alpha = s - m, and Z = sum exp(s - m) = 1 / max alpha.
    // Not in a row whose weights are all 0 (every score -inf, as a fully
    // masked attn_bias gives, or no incoming edge): there is no max to divide by.
    return { scored: false, known: amax > 0, m: NaN, sum: 1 / amax, asum: asum, s: null,
      shifted: function (e) { return Math.log(a[e]) - Math.log(amax); }, a: a };
  }

  // The edges j -> i of edge e: itself, or it and its duplicates.
  function runEdges(L, e) {
    const run = runOf(L, e), es = [];
    for (let k = run[0]; k < run[1]; k++) es.push(k);
    return es;
  }
  // The weight of edge e's matrix cell: the sum over its duplicates.
  function cellWeight(L, e) {
    const w = weightsOf(L, S.head);
    let sum = 0;
    for (const k of runEdges(L, e)) sum += w[k];
    return sum;
  }

  function edgeText(e) {
    const L = cur();
    const j = L.src[e], i = L.dst[e];
    const es = runEdges(L, e), many = es.length > 1;
    const hidden = es.filter(function (k) { return !vis[k]; }).length;
    const lines = [(many ? es.length + " edges" : "edge") + " j \u2192 i: " + labelOf(j) + " \u2192 " +
      labelOf(i) + "   [" + L.name + "]" +
      (hidden === 0 ? "" : "   (" + (many ? hidden + " " : "") + "hidden by a filter)")];
    if (isStructure(j, i)) lines.push("also an edge of the given structure");
    // Each duplicate's value, or the one edge's.
    function each(f) { return es.map(function (k) { return fmt(f(k)); }).join(", "); }
    function weight(w, what) {
      if (!many) return "\u03b1 = " + fmt(w[e]) + "   (" + what + ")";
      let sum = 0;
      for (const k of es) sum += w[k];
      return "\u03b1 = " + es.map(function (k) { return fmt(w[k]); }).join(" + ") + " = " + fmt(sum) +
        "   (" + what + "; duplicate edges add up, as in attention_matrix)";
    }
    if (S.head < 0) {
      lines.push(weight(weightsOf(L, -1), "mean over " + L.H + " heads, not one head's softmax"));
      const per = [];
      for (let h = 0; h < L.H; h++) {
        let x = 0;
        for (const k of es) x += L.alpha[h * L.E + k];
        per.push(fmt(x));
      }
      lines.push("per head: " + per.join(", "));
      return lines.join("\n");
    }
    const f = rowFacts(L, S.head, i);
    lines.push(weight(f.a, "head " + S.head));
    if (f.scored && !f.known) {
      lines.push("score s = " + each(f.s));
      lines.push("target max m_i = " + fmt(f.m) + ",  s \u2212 m_i = \u2014,  target sum: no weight");
      lines.push(ZERO_SCORED);
    } else if (f.scored) {
      lines.push("score s = " + each(f.s));
      lines.push("target max m_i = " + fmt(f.m));
      lines.push("s \u2212 m_i = " + each(f.shifted) + ",  exp(s \u2212 m_i) = " +
        each(function (k) { return Math.exp(f.shifted(k)); }));
      lines.push("target sum \u03a3 exp(s \u2212 m_i) = " + fmt(f.sum));
    } else if (f.known) {
      lines.push("s \u2212 m_i = " + each(f.shifted) + "   (ln \u03b1 \u2212 ln max \u03b1; scores not given)");
      lines.push("target sum \u03a3 exp(s \u2212 m_i) = 1 / max \u03b1 = " + fmt(f.sum));
    } else {
      lines.push("s \u2212 m_i = \u2014,  target sum: no weight");
      lines.push(ZERO_ROW);
    }
    const c = rowCount(L, i);
    if (c.kept < c.full) {
      lines.push("row cut: " + c.kept + " of " + c.full + " incoming edges kept (" + cutWhy(L, i) +
        "); the max and the sum are the full row's");
    }
    return lines.join("\n");
  }
  const ZERO_ROW = "every weight of this target is 0 (every score \u2212inf, e.g. masked by " +
    "attn_bias): without scores= the shifts cannot be read from \u03b1";
  const ZERO_SCORED = "every score of this target is \u2212inf (e.g. masked by attn_bias): its " +
    "weights are 0, and there is no max to subtract";
  // Why a row has fewer edges on the page than in the layer.
  function cutWhy(L, i) {
    const top = L.cutRows !== null && L.cutRows[i] === 1, nb = ids !== null;
    if (top && nb) return "cut to the neighbourhood, then to its heaviest edges before writing (max_edges)";
    return top ? "cut to its heaviest edges before writing (max_edges)"
      : "its other sources lie outside the neighbourhood";
  }
  // A matrix cell without a written edge: not in the graph, or cut by max_edges.
  function missingText(L, j, i) {
    let t = "no edge " + labelOf(j) + " \u2192 " + labelOf(i);
    if (L.cutRows !== null && L.cutRows[i] === 1) {
      t += " written: the row of " + labelOf(i) + " was cut to its " + rowCount(L, i).kept +
        " heaviest incoming edges before writing (max_edges), so this edge was cut, or is not in the graph";
    } else t += ": not in the graph";
    if (isStructure(j, i)) t += "\n(an edge of the given structure, without attention)";
    return t;
  }

  const tip = d3.select("#tooltip");
  function showTip(text, ev, attrs) {
    tip.text(text).attr("hidden", null);
    tip.attr("data-edge", attrs.edge || null).attr("data-alpha", attrs.alpha || null);
    const node = tip.node();
    const x = Math.min(ev.clientX + 14, window.innerWidth - node.offsetWidth - 4);
    const y = Math.min(ev.clientY + 14, window.innerHeight - node.offsetHeight - 4);
    tip.style("left", Math.max(0, x) + "px").style("top", Math.max(0, y) + "px");
  }
  function hideTip() { tip.attr("hidden", true); }

  // The last pointer position (client px). Pointer events, not mouse events:
  // d3's zoom stops mousemove during a drag.
  let pointer = null;
  window.addEventListener("pointermove", function (ev) { pointer = [ev.clientX, ev.clientY]; },
    { capture: true, passive: true });
  // The tooltip describes what is under the pointer, or nothing. A click
  // changes the table and the status line, scrolling moves the page, a zoom
  // moves the graph: the canvas under a still pointer changes without a
  // mousemove, and the tooltip would stay over the matrix describing a cell
  // the pointer has left. Hit-test again at the pointer.
  function refreshHover() {
    if (S.hover === null && tip.attr("hidden") !== null) return; // nothing shown
    const el = pointer ? document.elementFromPoint(pointer[0], pointer[1]) : null;
    const ev = pointer ? { clientX: pointer[0], clientY: pointer[1] } : null;
    if (el === gOver) hoverGraph(ev);
    else if (el === mOver) hoverMatrix(ev);
    else { S.hover = null; hideTip(); schedule(["overlay"]); }
  }
  window.addEventListener("scroll", refreshHover, { passive: true });

  // --------------------------------------------------------------- the table
  function drawTable() {
    const box = d3.select("#softmax");
    box.selectAll("*").remove();
    if (S.focus < 0) {
      box.append("span").attr("class", "hint").text("Click a token (in the graph, or a row of the " +
        "matrix) to see its incoming edges and its softmax step by step.");
      return;
    }
    const L = cur(), i = S.focus, c = rowCount(L, i);
    if (c.full === 0) { // nothing was normalized: no max, no sum
      box.append("div").style("font-weight", 600)
        .text("target " + labelOf(i) + " has no incoming edges: no softmax");
      return;
    }
    const w = weightsOf(L, S.head);
    const edges = [];
    for (let e = L.rowptr[i]; e < L.rowptr[i + 1]; e++) edges.push(e);
    edges.sort(function (p, q) { return w[q] - w[p] || p - q; });
    let title = "softmax of target " + labelOf(i) + ": " + (c.kept < c.full
      ? c.kept + " of its " + c.full + " incoming edges kept" : "its " + c.full + " incoming edges") + " (one row)";
    if (c.kept < c.full) {
      title += "; " + cutWhy(L, i) + ", so the \u03b1 shown sum to less than the whole row's; the max and the " +
        "sum are the full row's";
    }
    box.append("div").style("font-weight", 600).text(title);
    const f = S.head >= 0 ? rowFacts(L, S.head, i) : null;
    if (!f) {
      box.append("div").attr("class", "hint").text("mean over heads: an average of " + L.H +
        " softmaxes, not a softmax itself; pick a head for the subtract-the-max steps");
    } else if (!f.known) box.append("div").attr("class", "hint").text(f.scored ? ZERO_SCORED : ZERO_ROW);
    const cols = !f ? ["source j", "\u03b1 (mean)"]
      : f.scored ? ["source j", "s = q\u00b7k", "s \u2212 max", "exp(s \u2212 max)", "\u03b1"]
        : ["source j", "s \u2212 max", "exp(s \u2212 max)", "\u03b1"];
    const table = box.append("table");
    const head = table.append("thead").append("tr");
    cols.forEach(function (c) { head.append("th").text(c); });
    const body = table.append("tbody");
    edges.slice(0, TABLE_ROWS).forEach(function (e) {
      const tr = body.append("tr").attr("data-src", L.src[e]).classed("hidden-edge", !vis[e]);
      const who = labelOf(L.src[e]) + (vis[e] ? "" : " (hidden)");
      tr.append("td").text(who).attr("title", who); // whole, where the column cuts it
      if (f) {
        if (f.scored) tr.append("td").text(fmt(f.s(e)));
        tr.append("td").text(f.known ? fmt(f.shifted(e)) : "\u2014");
        tr.append("td").text(f.known ? fmt(Math.exp(f.shifted(e))) : "\u2014");
      }
      tr.append("td").attr("class", "alpha").text(fmt(w[e]));
    });
    if (edges.length > TABLE_ROWS) {
      let rest = 0;
      for (let k = TABLE_ROWS; k < edges.length; k++) rest += w[edges[k]];
      body.append("tr").append("td").attr("colspan", cols.length)
        .text("\u2026 " + (edges.length - TABLE_ROWS) + " lighter edges, \u03a3 \u03b1 = " + fmt(rest));
    }
    let total = 0;
    for (const e of edges) total += w[e];
    tableFoot(table.append("tfoot"), f, total);
  }

  // The max and the sum of the row (of the full row, where it was cut), and Σ α shown.
  function tableFoot(foot, f, total) {
    if (!f) {
      const r = foot.append("tr");
      r.append("td").text("sum"); r.append("td").text(fmt(total));
      return;
    }
    if (f.known) { // a row without weight has no max to subtract
      const r1 = foot.append("tr");
      r1.append("td").text(f.scored ? "max m_i" : "max");
      if (f.scored) r1.append("td").text(fmt(f.m));
      r1.append("td").text("0"); r1.append("td").text("1"); r1.append("td").text("");
    }
    const r2 = foot.append("tr");
    r2.append("td").text("sum");
    if (f.scored) r2.append("td").text("");
    r2.append("td").text(""); r2.append("td").text(f.known ? fmt(f.sum) : "no weight");
    r2.append("td").text(fmt(total));
  }

  // ---------------------------------------------------------------- updates
  let pending = { visible: false, graph: false, matrix: false, overlay: false, table: false };
  let frameRequested = false;
  const api = { ready: false, firstPaintMs: NaN, paintedMs: NaN, lastFrameMs: NaN, frames: 0 };

  function frame() {
    frameRequested = false;
    const t = performance.now();
    const p = pending;
    pending = { visible: false, graph: false, matrix: false, overlay: false, table: false };
    if (p.visible) computeVisible();
    if (p.graph || p.visible) drawGraph();
    if (p.matrix || p.visible) drawMatrix();
    if (p.overlay || p.graph || p.visible) { drawOverlay(); drawMatrixOverlay(); }
    if (p.table || p.visible) drawTable();
    // What moved the canvases or what is drawn on them (the status line, the
    // table, a zoom) moved them under a still pointer, which sends no event:
    // test again what the pointer is over.
    if (p.visible || p.graph || p.table) refreshHover();
    api.lastFrameMs = performance.now() - t;
    api.frames++;
  }
  function schedule(what) {
    for (const k of what) pending[k] = true;
    if (!frameRequested) { frameRequested = true; requestAnimationFrame(frame); }
  }

  // ---------------------------------------------------------------- controls
  const layerSel = d3.select("#layer");
  layers.forEach(function (L, l) { layerSel.append("option").attr("value", l).text(L.name); });
  layerSel.property("disabled", layers.length < 2);
  const headSel = d3.select("#head");
  function fillHeads() {
    const L = cur();
    headSel.selectAll("option").remove();
    for (let h = 0; h < L.H; h++) headSel.append("option").attr("value", h).text("head " + h);
    if (L.H > 1) {
      headSel.append("option").attr("value", -1)
        .text("mean over heads (average of " + L.H + " heads' weights, not one softmax)");
    }
    if (S.head >= L.H || (S.head < 0 && L.H === 1)) S.head = 0;
    headSel.property("value", S.head);
  }
  const topk = document.getElementById("topk");
  function setTopkRange(keepAll) {
    const L = cur();
    const max = Math.max(1, L.maxDeg);
    topk.max = String(max);
    if (keepAll || S.topk > max) S.topk = max;
    topk.value = String(S.topk);
    showTopk();
  }
  function showTopk() {
    const L = cur();
    d3.select("#topk-value").text(S.topk >= L.maxDeg ? "all (" + L.maxDeg + ")" : String(S.topk));
  }
  const minw = document.getElementById("minw");
  function minwOf(v) { return v <= 0 ? 0 : Math.pow(10, -4 + 4 * v / 400); }

  layerSel.on("change", function () {
    const all = S.topk >= cur().maxDeg;
    S.layer = +this.value; fillHeads(); setTopkRange(all); updateNotes();
    S.hover = null; hideTip();
    schedule(["visible"]);
  });
  headSel.on("change", function () { S.head = +this.value; S.hover = null; hideTip(); schedule(["visible"]); });
  topk.addEventListener("input", function () { S.topk = +topk.value; showTopk(); schedule(["visible"]); });
  minw.addEventListener("input", function () {
    S.minw = minwOf(+minw.value);
    d3.select("#minw-value").text(S.minw === 0 ? "0" : fmt(S.minw));
    schedule(["visible"]);
  });

  const structureBox = document.getElementById("structure");
  if (structure) {
    d3.select("#structure-toggle").attr("hidden", null);
    d3.select("#structure-count").text("structure (" + structure.count + " given edge" +
      (structure.count === 1 ? "" : "s") + ")");
  }
  structureBox.addEventListener("change", function () {
    S.structure = structureBox.checked;
    schedule(["graph", "matrix"]);
  });

  function updateNotes() {
    const notes = (D.notes || []).slice();
    if (cur().note) notes.push(cur().note);
    d3.select("#notes").text(notes.join("  \u00b7  "));
  }

  // ------------------------------------------------------------ hit testing
  function distToQuad(px, py, x0, y0, cx, cy, x1, y1) {
    let best = Infinity, ax = x0, ay = y0;
    for (let s = 1; s <= 12; s++) {
      const t = s / 12, u = 1 - t;
      const bx = u * u * x0 + 2 * u * t * cx + t * t * x1, by = u * u * y0 + 2 * u * t * cy + t * t * y1;
      const dx = bx - ax, dy = by - ay, l2 = dx * dx + dy * dy;
      let q = l2 > 0 ? ((px - ax) * dx + (py - ay) * dy) / l2 : 0;
      q = Math.max(0, Math.min(1, q));
      const d = Math.hypot(px - (ax + q * dx), py - (ay + q * dy));
      if (d < best) best = d;
      ax = bx; ay = by;
    }
    return best;
  }

  function pickEdge(px, py) {
    const L = cur();
    const tol = 5;
    let best = -1, bestD = tol;
    // Heaviest first (drawn last, on top), so a tie goes to the edge seen on top.
    for (let k = drawn.length - 1; k >= 0; k--) {
      const e = drawn[k], j = L.src[e], i = L.dst[e];
      let d;
      if (i === j) {
        const c = loopOf(i);
        d = Math.abs(Math.hypot(px - c[0], py - c[1]) - c[2]);
      } else {
        const c = control(j, i);
        if (px < Math.min(sx[j], c[0], sx[i]) - tol || px > Math.max(sx[j], c[0], sx[i]) + tol ||
            py < Math.min(sy[j], c[1], sy[i]) - tol || py > Math.max(sy[j], c[1], sy[i]) + tol) continue;
        d = distToQuad(px, py, sx[j], sy[j], c[0], c[1], sx[i], sy[i]);
      }
      if (d < bestD) { bestD = d; best = e; }
    }
    return best;
  }

  let qt = null; // quadtree of the nodes in screen px, rebuilt after a zoom
  function pickNode(px, py) {
    if (!qt) {
      qt = d3.quadtree().x(function (i) { return sx[i]; }).y(function (i) { return sy[i]; });
      for (let i = 0; i < N; i++) qt.add(i);
    }
    const found = qt.find(px, py, Math.max(nodeR(), 4));
    return found === undefined ? -1 : found;
  }

  function hoverGraph(ev) {
    const rect = gOver.getBoundingClientRect();
    const px = ev.clientX - rect.left, py = ev.clientY - rect.top;
    const node = pickNode(px, py);
    const L = cur();
    if (node >= 0) {
      S.hover = { node: node, edge: -1, cell: null };
      const c = rowCount(L, node);
      showTip(labelOf(node) + "\nin-degree " + c.full + (c.kept < c.full ? " (" + c.kept + " kept)" : "") +
        "; click for its incoming edges and softmax", ev, {});
    } else {
      const e = pickEdge(px, py);
      if (e >= 0) {
        S.hover = { node: -1, edge: e, cell: [L.dst[e], L.src[e]] };
        showTip(edgeText(e), ev, { edge: L.src[e] + "," + L.dst[e], alpha: String(cellWeight(L, e)) });
      } else { S.hover = null; hideTip(); }
    }
    schedule(["overlay"]);
  }

  function hoverMatrix(ev) {
    const rect = mOver.getBoundingClientRect();
    const i = Math.floor((ev.clientY - rect.top - M.top) / M.cell);
    const j = Math.floor((ev.clientX - rect.left - M.left) / M.cell);
    if (!M.on || i < 0 || j < 0 || i >= N || j >= N) { S.hover = null; hideTip(); schedule(["overlay"]); return; }
    const L = cur();
    const e = findEdge(L, j, i);
    S.hover = { node: -1, edge: e, cell: [i, j] };
    if (e >= 0) showTip(edgeText(e), ev, { edge: j + "," + i, alpha: String(cellWeight(L, e)) });
    else showTip(missingText(L, j, i), ev, {});
    schedule(["overlay"]);
  }

  function focusOn(i) {
    S.focus = (i === S.focus) ? -1 : i;
    schedule(["visible"]);
  }

  d3.select(gOver).on("mousemove", hoverGraph)
    .on("mouseleave", function () { S.hover = null; hideTip(); schedule(["overlay"]); })
    .on("click", function (ev) {
      const rect = gOver.getBoundingClientRect();
      const node = pickNode(ev.clientX - rect.left, ev.clientY - rect.top);
      if (node >= 0) focusOn(node); else if (S.focus >= 0) focusOn(S.focus);
    });
  d3.select(mOver).on("mousemove", hoverMatrix)
    .on("mouseleave", function () { S.hover = null; hideTip(); schedule(["overlay"]); })
    .on("click", function (ev) {
      const rect = mOver.getBoundingClientRect();
      const i = Math.floor((ev.clientY - rect.top - M.top) / M.cell);
      if (M.on && i >= 0 && i < N) focusOn(i);
    });
  d3.select(gOver).call(d3.zoom().scaleExtent([0.5, 60]).on("zoom", function (ev) {
    T = ev.transform; qt = null; schedule(["graph"]);
  }));
  window.addEventListener("resize", function () {
    computeFit(); layoutMatrix(); qt = null; schedule(["visible"]);
  });

  // --------------------------------------------------------- for the tests
  function quadMid(e) {
    const L = cur(), j = L.src[e], i = L.dst[e];
    // A loop's far side: its near side lies within the node's own hover disc.
    if (i === j) { const c = loopOf(i), d = loopDir(i); return [c[0] + d[0] * c[2], c[1] + d[1] * c[2]]; }
    const c = control(j, i);
    return [0.25 * sx[j] + 0.5 * c[0] + 0.25 * sx[i], 0.25 * sy[j] + 0.5 * c[1] + 0.25 * sy[i]];
  }
  function client(canvas, p) {
    const r = canvas.getBoundingClientRect();
    return [r.left + p[0], r.top + p[1]];
  }
  api.state = function () {
    return { layer: S.layer, head: S.head, topk: S.topk, minw: S.minw, focus: S.focus,
      drawn: drawn.length, edges: cur().E, layout: D.layout, matrix: M.on, labelFit: labelFit,
      structure: structure ? structure.count : null, structureShown: S.structure,
      structureDrawn: structureDrawn, structureMarked: structureMarked, measured: measured };
  };
  // No frame pending: what is drawn matches state() (a change schedules a frame at once).
  api.settled = function () { return !frameRequested; };
  api.drawnPairs = function () {
    const L = cur();
    return Array.from(drawn, function (e) { return [L.src[e], L.dst[e]]; });
  };
  api.edgeOf = function (j, i) { return findEdge(cur(), j, i); };
  // fitLabel on any text, in the graph's canvas: what is shown and how many
  // measureText calls it took.
  api.fitLabel = function (text, r) {
    const before = measured;
    const f = fitLabel(gCanvas.getContext("2d"), text, r);
    return { text: f.text, width: f.width, room: LABEL_ROOM * 2 * r, measurements: measured - before };
  };
  api.edgePoint = function (j, i) { return client(gOver, quadMid(findEdge(cur(), j, i))); };
  api.nodeFill = function (i) {
    // The colour painted at node i's centre, off the label: a pixel left of it.
    const ctx = gCanvas.getContext("2d");
    const p = ctx.getImageData(Math.round((sx[i] - 0.6 * nodeR()) * dpr), Math.round(sy[i] * dpr), 1, 1).data;
    return [p[0], p[1], p[2]];
  };
  // The RGBA of the graph's canvas at a client point (alpha 0: nothing drawn there).
  api.graphPixel = function (x, y) {
    const r = gCanvas.getBoundingClientRect();
    const p = gCanvas.getContext("2d").getImageData(Math.floor((x - r.left) * dpr), Math.floor((y - r.top) * dpr), 1, 1).data;
    return [p[0], p[1], p[2], p[3]];
  };
  api.nodePoint = function (i) { return client(gOver, [sx[i], sy[i]]); };
  api.cellPoint = function (i, j) {
    return client(mOver, [M.left + (j + 0.5) * M.cell, M.top + (i + 0.5) * M.cell]);
  };
  // Set a slider as a user would (input event), resolve after the next paint.
  api.slide = function (id, value) {
    const el = document.getElementById(id);
    el.value = String(value);
    const t = performance.now();
    el.dispatchEvent(new Event("input", { bubbles: true }));
    return new Promise(function (resolve) {
      requestAnimationFrame(function () {
        requestAnimationFrame(function () { resolve(performance.now() - t); });
      });
    });
  };
  window.gnnattnExplorer = api;

  // -------------------------------------------------------------- first paint
  fillHeads();
  setTopkRange(true);
  updateNotes();
  drawLegend();
  drawNodeLegend();
  if (D.matrixNote) d3.select("#matrix-note").attr("hidden", null).text(D.matrixNote);
  if (D.empty) {
    d3.select("#empty").attr("hidden", null).text(D.empty);
  }
  computeFit();
  layoutMatrix();
  computeVisible();
  drawGraph();
  drawMatrix();
  drawOverlay();
  drawMatrixOverlay();
  drawTable();
  api.firstPaintMs = performance.now();
  api.ready = true;
  document.body.dataset.ready = "1";
  // On screen: the frame after the next one has been painted. Both are times
  // since the navigation started (performance's time origin), measured by the
  // page itself, so a busy test driver does not count.
  api.paintedMs = NaN;
  requestAnimationFrame(function () {
    requestAnimationFrame(function () { api.paintedMs = performance.now(); });
  });
})();
