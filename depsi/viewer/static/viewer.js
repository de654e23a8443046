// depsi viewer: the points of a result on a canvas (one ImageData write per point, no DOM per
// point), an OpenStreetMap basemap when tiles load and a lon/lat graticule always, a point's
// series from the server (or from the data embedded in a one-file export).
"use strict";
(function () {
  const R = 6378137.0;                       // Web Mercator radius (m)
  const TILE = 256;
  const PICK_PIXELS = 8;                     // a click picks the nearest point within this
  const QUANTITIES = ["velocity", "velocity_std", "height_error", "height_error_std",
    "temporal_coherence", "scatterer", "model_choice", "displacement_std"];
  const EMBEDDED = window.DEPSI_DATA || null;

  const $ = (id) => document.getElementById(id);
  const state = {
    meta: null, cols: {}, column: null, low: 0, high: 1, diverging: true, lut: null,
    minCoherence: 0, kinds: null, models: null, view: null, drawn: 0, basemap: true,
    tiles: new Map(), tilesLoaded: 0, tilesFailed: 0, picked: null, box: null, drag: null,
    firstDraw: null, pending: false,
  };

  // ------------------------------------------------------------------------------ data
  function decode(text) {
    const bytes = Uint8Array.from(atob(text), (c) => c.charCodeAt(0));
    return new Float32Array(bytes.buffer);
  }

  async function fetchJSON(url) {
    const response = await fetch(url);
    if (!response.ok) throw new Error(url + ": " + response.status + " " + await response.text());
    return response.json();
  }

  async function column(name) {
    if (state.cols[name]) return state.cols[name];
    if (EMBEDDED) {
      state.cols[name] = decode(EMBEDDED.columns[name]);
    } else {
      const response = await fetch("api/column/" + encodeURIComponent(name));
      if (!response.ok) throw new Error("column " + name + ": " + response.status);
      state.cols[name] = new Float32Array(await response.arrayBuffer());
    }
    return state.cols[name];
  }

  function filterQuery() {
    let q = "min_coherence=" + state.minCoherence;
    if (state.kinds) q += "&kinds=" + [...state.kinds].join(",");
    if (state.models) q += "&models=" + [...state.models].join(",");
    return q;
  }

  function passes(i) {
    const c = state.cols;
    if (state.minCoherence > 0 && c.temporal_coherence && !(c.temporal_coherence[i] >= state.minCoherence)) return false;
    if (state.kinds && c.scatterer && !state.kinds.has(c.scatterer[i])) return false;
    if (state.models && c.model_choice && !state.models.has(c.model_choice[i])) return false;
    return true;
  }

  // embedded data: the point's record built here, in the server's shape
  function embeddedPoint(i) {
    const m = state.meta, T = m.n_epochs, c = state.cols;
    const slice = (key) => EMBEDDED[key] ? Array.from(embeddedMatrix(key).subarray(i * T, (i + 1) * T)) : null;
    const values = {}, absent = [];
    for (const name of QUANTITIES) {
      if (name === "displacement_std") { if (!EMBEDDED.displacement_std) absent.push(name); continue; }
      if (!c[name]) { absent.push(name); continue; }
      let v = Number.isFinite(c[name][i]) ? c[name][i] : null;
      if (name === "scatterer" && m.kinds && v !== null) v = m.kinds[v];
      if (name === "model_choice" && m.models && v !== null) v = m.models[v];
      values[name] = v;
    }
    const nan = (a) => a && a.map((v) => (Number.isFinite(v) ? v : null));
    return { index: i, id: EMBEDDED.ids ? EMBEDDED.ids[i] : null, lon: EMBEDDED.lon[i],
      lat: EMBEDDED.lat[i], values, absent, displacement: nan(slice("displacement")),
      displacement_std: nan(slice("displacement_std")), model_line: nan(slice("model_line")),
      model_says: m.model_says };
  }

  const matrices = {};
  function embeddedMatrix(key) {
    if (!matrices[key]) matrices[key] = decode(EMBEDDED[key]);
    return matrices[key];
  }

  async function pick(x, y, radius) {
    if (!EMBEDDED) {
      const answer = await fetchJSON("api/pick?x=" + x + "&y=" + y + "&r=" + radius + "&" + filterQuery());
      return answer.point;
    }
    if (!state.mask) state.mask = filterMask();
    const px = state.cols.x, py = state.cols.y;
    let best = -1, bestD = radius * radius;
    for (let i = 0; i < px.length; i++) {
      const dx = px[i] - x, dy = py[i] - y, d = dx * dx + dy * dy;
      if (d <= bestD && state.mask[i]) { best = i; bestD = d; }
    }
    return best < 0 ? null : embeddedPoint(best);
  }

  async function boxSeries(x0, y0, x1, y1) {
    if (!EMBEDDED) {
      return fetchJSON("api/box?x0=" + x0 + "&y0=" + y0 + "&x1=" + x1 + "&y1=" + y1 + "&" + filterQuery());
    }
    if (!state.mask) state.mask = filterMask();
    const px = state.cols.x, py = state.cols.y, T = state.meta.n_epochs;
    const d = embeddedMatrix("displacement");
    const sum = new Float64Array(T), sum2 = new Float64Array(T), n = new Float64Array(T);
    let count = 0;
    const [xa, xb, ya, yb] = [Math.min(x0, x1), Math.max(x0, x1), Math.min(y0, y1), Math.max(y0, y1)];
    for (let i = 0; i < px.length; i++) {
      if (!state.mask[i] || px[i] < xa || px[i] > xb || py[i] < ya || py[i] > yb) continue;
      count++;
      for (let t = 0; t < T; t++) {
        const v = d[i * T + t];
        if (Number.isFinite(v)) { sum[t] += v; sum2[t] += v * v; n[t]++; }
      }
    }
    if (!count) return { count: 0, averaged: 0, mean: null, std: null };
    const mean = Array.from(sum, (s, t) => (n[t] ? s / n[t] : null));
    const std = Array.from(sum2, (s, t) => (n[t] ? Math.sqrt(Math.max(s / n[t] - mean[t] * mean[t], 0)) : null));
    return { count, averaged: count, mean, std };
  }

  // ------------------------------------------------------------------------- colours
  const DIVERGING = [[103, 0, 31], [178, 24, 43], [214, 96, 77], [244, 165, 130], [253, 219, 199],
    [247, 247, 247], [209, 229, 240], [146, 197, 222], [67, 147, 195], [33, 102, 172], [5, 48, 97]];
  const SEQUENTIAL = [[68, 1, 84], [72, 40, 120], [62, 74, 137], [49, 104, 142], [38, 130, 142],
    [31, 158, 137], [53, 183, 121], [109, 205, 89], [180, 222, 44], [253, 231, 37]];

  // 255 colours of the scale and, at NO_VALUE, grey for a point without a value
  const NO_VALUE = 255;
  function lut(stops) {
    const out = new Uint32Array(256), rgb = [];
    for (let k = 0; k < NO_VALUE; k++) {
      const f = (k / (NO_VALUE - 1)) * (stops.length - 1), j = Math.min(Math.floor(f), stops.length - 2), w = f - j;
      const c = [0, 1, 2].map((b) => Math.round(stops[j][b] * (1 - w) + stops[j + 1][b] * w));
      out[k] = (255 << 24) | (c[2] << 16) | (c[1] << 8) | c[0];   // little-endian RGBA
      rgb.push(c);
    }
    out[NO_VALUE] = (255 << 24) | (150 << 16) | (150 << 8) | 150;
    out.rgb = rgb;
    return out;
  }

  function setColumn(name, keepRange) {
    const info = state.meta.columns.find((c) => c.name === name);
    state.column = name;
    state.diverging = info.diverging;
    if (!keepRange) { state.low = info.low; state.high = info.high; }
    state.lut = lut(state.diverging ? DIVERGING : SEQUENTIAL);
    state.colours = null;
    $("low").value = +state.low.toPrecision(4);
    $("high").value = +state.high.toPrecision(4);
    drawColourbar(info);
  }

  function drawColourbar(info) {
    const canvas = $("colourbar-canvas"), ctx = canvas.getContext("2d");
    for (let k = 0; k < canvas.width; k++) {
      const c = state.lut.rgb[Math.round((k / (canvas.width - 1)) * (NO_VALUE - 1))];
      ctx.fillStyle = "rgb(" + c.join(",") + ")";
      ctx.fillRect(k, 0, 1, canvas.height);
    }
    const scale = displayScale(info);
    $("colour-low").textContent = (state.low * scale.factor).toPrecision(3);
    $("colour-high").textContent = (state.high * scale.factor).toPrecision(3);
    $("colour-name").textContent = info.name + (scale.units ? " (" + scale.units + ")" : "");
  }

  // metres shown as millimetres: the unit PS-InSAR users read
  function displayScale(info) {
    if (/^m\s*(\/\s*(yr|year|a)|\s+(yr|year|a)-1)$/.test(info.units)) return { factor: 1e3, units: "mm/yr" };
    if (info.units === "m" && /std|displacement|seasonal|step|offset/.test(info.name)) return { factor: 1e3, units: "mm" };
    return { factor: 1, units: info.units };
  }

  // --------------------------------------------------------------------------- view
  function size() {
    const pane = $("map-pane");
    return [pane.clientWidth, pane.clientHeight];
  }

  function fitView() {
    const x = state.cols.x, y = state.cols.y;
    let x0 = Infinity, x1 = -Infinity, y0 = Infinity, y1 = -Infinity;
    for (let i = 0; i < x.length; i++) {
      if (x[i] < x0) x0 = x[i]; if (x[i] > x1) x1 = x[i];
      if (y[i] < y0) y0 = y[i]; if (y[i] > y1) y1 = y[i];
    }
    if (!Number.isFinite(x0)) { x0 = y0 = -1000; x1 = y1 = 1000; }
    const [W, H] = size(), span = Math.max(x1 - x0, y1 - y0, 50);
    state.extent = [x0, x1, y0, y1];
    state.view = { cx: (x0 + x1) / 2, cy: (y0 + y1) / 2,
      scale: 0.9 * Math.min(W / Math.max(x1 - x0, 50), H / Math.max(y1 - y0, 50)) };
    state.spacing = Math.sqrt(Math.max((x1 - x0) * (y1 - y0), span) / Math.max(x.length, 1));
  }

  function toScreen(x, y) {
    const [W, H] = size(), v = state.view;
    return [(x - v.cx) * v.scale + W / 2, H / 2 - (y - v.cy) * v.scale];
  }

  function toMap(px, py) {
    const [W, H] = size(), v = state.view;
    return [(px - W / 2) / v.scale + v.cx, v.cy - (py - H / 2) / v.scale];
  }

  function lonLatToMap(lon, lat) {
    const o = state.meta.origin;
    const phi = Math.max(Math.min(lat, 85.05112878), -85.05112878) * Math.PI / 180;
    return [R * lon * Math.PI / 180 - o[0], R * Math.log(Math.tan(Math.PI / 4 + phi / 2)) - o[1]];
  }

  function mapToLonLat(x, y) {
    const o = state.meta.origin;
    return [((x + o[0]) / R) * 180 / Math.PI, (2 * Math.atan(Math.exp((y + o[1]) / R)) - Math.PI / 2) * 180 / Math.PI];
  }

  function resize() {
    const [W, H] = size();
    for (const id of ["basemap", "points", "overlay"]) { $(id).width = W; $(id).height = H; }
  }

  function schedule() {
    if (state.pending) return;
    state.pending = true;
    requestAnimationFrame(() => { state.pending = false; draw(); });
  }

  function draw() {
    drawBasemap();
    drawPoints();
    drawOverlay();
  }

  // ------------------------------------------------------------------------ points
  // Per point, once per change of column, range or filters (not per frame): its colour's index
  // into the table and whether it passes the filters.
  function colourIndices() {
    const v = state.cols[state.column], n = v.length;
    const out = state.colours && state.colours.length === n ? state.colours : new Uint8Array(n);
    const lo = state.low, top = NO_VALUE - 1, factor = top / (state.high - state.low || 1);
    for (let i = 0; i < n; i++) {
      const value = v[i];
      if (value !== value) { out[i] = NO_VALUE; continue; }
      const k = (value - lo) * factor;
      out[i] = k < 0 ? 0 : k > top ? top : k;
    }
    return out;
  }

  function filterMask() {
    const x = state.cols.x, y = state.cols.y, n = x.length, out = new Uint8Array(n);
    let kept = 0;
    // a point without a position (NaN) is never drawn, as the server never picks it
    for (let i = 0; i < n; i++) if (x[i] === x[i] && y[i] === y[i] && passes(i)) { out[i] = 1; kept++; }
    out.kept = kept;
    return out;
  }

  function drawPoints() {
    const canvas = $("points"), ctx = canvas.getContext("2d"), W = canvas.width, H = canvas.height;
    if (!state.image || state.image.width !== W || state.image.height !== H) state.image = ctx.createImageData(W, H);
    const image = state.image, pixels = new Uint32Array(image.data.buffer);
    pixels.fill(0);
    if (!state.colours) state.colours = colourIndices();
    if (!state.mask) state.mask = filterMask();
    const x = state.cols.x, y = state.cols.y, colours = state.colours, mask = state.mask, n = x.length;
    const table = state.lut, rim = (255 << 24) | (110 << 16) | (110 << 8) | 110;
    const s = state.view.scale, dot = Math.max(2, Math.min(8, Math.round(0.8 * state.spacing * s)));
    const half = dot >> 1, ox = W / 2 - state.view.cx * s - half + 0.5, oy = H / 2 + state.view.cy * s - half + 0.5;
    let drawn = 0;
    for (let i = 0; i < n; i++) {
      if (!mask[i]) continue;
      const fx = x[i] * s + ox, fy = oy - y[i] * s;
      if (fx <= -dot || fy <= -dot || fx >= W || fy >= H) continue;
      const px = Math.floor(fx), py = Math.floor(fy), colour = table[colours[i]];
      drawn++;
      if (dot === 2 && px >= 0 && py >= 0 && px + 2 <= W && py + 2 <= H) {
        const o = py * W + px;
        pixels[o] = colour; pixels[o + 1] = colour; pixels[o + W] = colour; pixels[o + W + 1] = colour;
        continue;
      }
      const xa = px < 0 ? 0 : px, xb = Math.min(px + dot, W), ya = py < 0 ? 0 : py, yb = Math.min(py + dot, H);
      if (dot >= 4) {
        // a dark rim, so that points near zero (white on the scale) stand out on a pale map
        for (let r = ya; r < yb; r++) pixels.fill(rim, r * W + xa, r * W + xb);
        const xi = Math.max(px + 1, 0), xo = Math.min(px + dot - 1, W);
        for (let r = Math.max(py + 1, 0); r < Math.min(py + dot - 1, H); r++) pixels.fill(colour, r * W + xi, r * W + xo);
      } else {
        for (let r = ya; r < yb; r++) pixels.fill(colour, r * W + xa, r * W + xb);
      }
    }
    ctx.putImageData(image, 0, 0);
    state.drawn = drawn;
    $("drawn-count").textContent = drawn;
    if (state.firstDraw === null) {
      state.firstDraw = performance.now();
      document.body.dataset.firstDrawMs = state.firstDraw.toFixed(1);
      document.body.dataset.ready = "1";
    }
  }

  // ------------------------------------------------------------------------- hover
  // The drawn point nearest the cursor within PICK_PIXELS, found here from the columns the page
  // holds (no request): its value of the coloured variable, its coherence, kind and model.
  function hover(ex, ey) {
    const tip = $("tooltip");
    if (!state.mask) { tip.hidden = true; return; }
    const [mx, my] = toMap(ex, ey), r = PICK_PIXELS / state.view.scale;
    const x = state.cols.x, y = state.cols.y, mask = state.mask, n = x.length;
    let best = -1, bestD = r * r;
    for (let i = 0; i < n; i++) {
      if (!mask[i]) continue;
      const dx = x[i] - mx;
      if (dx > r || dx < -r) continue;
      const dy = y[i] - my;
      if (dy > r || dy < -r) continue;
      const d = dx * dx + dy * dy;
      if (d < bestD) { bestD = d; best = i; }
    }
    if (best < 0) { tip.hidden = true; return; }
    const m = state.meta, info = m.columns.find((c) => c.name === state.column), scale = displayScale(info);
    const value = state.cols[state.column][best];
    let text = state.column + " " + (Number.isFinite(value) ? (value * scale.factor).toPrecision(3) + " " + scale.units : "no value");
    const c = state.cols;
    if (c.temporal_coherence && state.column !== "temporal_coherence") text += " · coherence " + c.temporal_coherence[best].toFixed(2);
    if (c.scatterer && m.kinds) text += " · " + m.kinds[c.scatterer[best]];
    if (c.model_choice && m.models) text += " · " + m.models[c.model_choice[best]];
    tip.textContent = text;
    tip.style.left = ex + 12 + "px";
    tip.style.top = ey + 12 + "px";
    tip.hidden = false;
    tip.dataset.index = best;
  }

  // ----------------------------------------------------------------------- overlay
  function drawOverlay() {
    const canvas = $("overlay"), ctx = canvas.getContext("2d");
    ctx.clearRect(0, 0, canvas.width, canvas.height);
    const ref = state.meta.reference;
    if (ref && ref.area) {
      ctx.setLineDash([5, 4]); ctx.strokeStyle = "#000"; ctx.lineWidth = 1.2;
      ctx.beginPath();
      ref.area.forEach(([x, y], k) => { const [a, b] = toScreen(x, y); k ? ctx.lineTo(a, b) : ctx.moveTo(a, b); });
      ctx.closePath(); ctx.stroke(); ctx.setLineDash([]);
    }
    if (ref && ref.point) {
      const [a, b] = toScreen(ref.point[0], ref.point[1]);
      ctx.fillStyle = "#000"; ctx.strokeStyle = "#fff"; ctx.lineWidth = 1.5;
      ctx.beginPath(); ctx.moveTo(a, b - 9); ctx.lineTo(a + 8, b + 6); ctx.lineTo(a - 8, b + 6); ctx.closePath();
      ctx.fill(); ctx.stroke();
    }
    if (state.picked) {
      const [a, b] = toScreen(state.picked.x, state.picked.y);
      ctx.strokeStyle = "#000"; ctx.lineWidth = 2;
      ctx.beginPath(); ctx.arc(a, b, 7, 0, 2 * Math.PI); ctx.stroke();
    }
    if (state.box) {
      const [a, b] = toScreen(state.box[0], state.box[1]), [c, d] = toScreen(state.box[2], state.box[3]);
      ctx.strokeStyle = "#111"; ctx.lineWidth = 1.5; ctx.fillStyle = "rgba(0,0,0,0.06)";
      ctx.fillRect(a, b, c - a, d - b); ctx.strokeRect(a, b, c - a, d - b);
    }
  }

  // ----------------------------------------------------------------------- basemap
  function niceStep(span) {
    const raw = span / 6, p = Math.pow(10, Math.floor(Math.log10(raw)));
    for (const m of [1, 2, 5, 10]) if (m * p >= raw) return m * p;
    return 10 * p;
  }

  function drawGraticule(ctx, W, H) {
    ctx.fillStyle = "#f4f3ef"; ctx.fillRect(0, 0, W, H);
    const [x0, y1] = toMap(0, 0), [x1, y0] = toMap(W, H);
    const [lon0, lat0] = mapToLonLat(x0, y0), [lon1, lat1] = mapToLonLat(x1, y1);
    const step = niceStep(Math.max(lon1 - lon0, lat1 - lat0));
    const digits = Math.max(0, -Math.floor(Math.log10(step)));
    ctx.strokeStyle = "#d3d0c8"; ctx.fillStyle = "#8a867c"; ctx.lineWidth = 1; ctx.font = "11px sans-serif";
    for (let lon = Math.ceil(lon0 / step) * step; lon <= lon1; lon += step) {
      const [px] = toScreen(lonLatToMap(lon, lat0)[0], 0);
      ctx.beginPath(); ctx.moveTo(px, 0); ctx.lineTo(px, H); ctx.stroke();
      ctx.fillText(lon.toFixed(digits) + "°", px + 2, 12);
    }
    for (let lat = Math.ceil(lat0 / step) * step; lat <= lat1; lat += step) {
      const [, py] = toScreen(0, lonLatToMap(lon0, lat)[1]);
      ctx.beginPath(); ctx.moveTo(0, py); ctx.lineTo(W, py); ctx.stroke();
      ctx.fillText(lat.toFixed(digits) + "°", 2, py - 2);
    }
  }

  function drawBasemap() {
    const canvas = $("basemap"), ctx = canvas.getContext("2d"), W = canvas.width, H = canvas.height;
    drawGraticule(ctx, W, H);
    if (!state.basemap || state.tilesFailed > 3 && state.tilesLoaded === 0) {
      updateBasemapState(); return;
    }
    const o = state.meta.origin, world = 2 * Math.PI * R;
    const z = Math.max(0, Math.min(19, Math.round(Math.log2(state.view.scale * world / TILE))));
    const n = 1 << z, tileMetres = world / n, pixels = tileMetres * state.view.scale;
    const [x0, y1] = toMap(0, 0), [x1, y0] = toMap(W, H);
    const tx0 = Math.floor((x0 + o[0] + world / 2) / tileMetres), tx1 = Math.floor((x1 + o[0] + world / 2) / tileMetres);
    const ty0 = Math.floor((world / 2 - (y1 + o[1])) / tileMetres), ty1 = Math.floor((world / 2 - (y0 + o[1])) / tileMetres);
    for (let tx = Math.max(tx0, 0); tx <= Math.min(tx1, n - 1); tx++) {
      for (let ty = Math.max(ty0, 0); ty <= Math.min(ty1, n - 1); ty++) {
        const image = tile(z, tx, ty);
        if (!image.complete || !image.naturalWidth) continue;
        const [px, py] = toScreen(tx * tileMetres - world / 2 - o[0], world / 2 - ty * tileMetres - o[1]);
        ctx.globalAlpha = 0.85;
        ctx.drawImage(image, px, py, pixels + 0.5, pixels + 0.5);
        ctx.globalAlpha = 1;
      }
    }
    updateBasemapState();
  }

  function tile(z, x, y) {
    const key = z + "/" + x + "/" + y;
    let image = state.tiles.get(key);
    if (!image) {
      image = new Image();
      image.onload = () => { state.tilesLoaded++; schedule(); };
      image.onerror = () => { state.tilesFailed++; updateBasemapState(); };
      image.src = state.meta.tiles.replace("{z}", z).replace("{x}", x).replace("{y}", y);
      state.tiles.set(key, image);
    }
    return image;
  }

  function updateBasemapState() {
    const online = state.basemap && state.tilesLoaded > 0;
    $("attribution").textContent = !online ? "lon/lat graticule (WGS84)" :
      /openstreetmap/.test(state.meta.tiles) ? "© OpenStreetMap contributors" : "tiles: " + state.meta.tiles.split("/")[2];
    $("basemap-state").textContent = !state.basemap ? "" :
      state.tilesLoaded ? "" : state.tilesFailed ? "(offline: graticule only)" : "(loading)";
    document.body.dataset.basemap = online ? "tiles" : "graticule";
  }

  // ------------------------------------------------------------------------ series
  function drawSeries(title, dates, values, std, line, scale) {
    const canvas = $("series"), ctx = canvas.getContext("2d"), W = canvas.width, H = canvas.height;
    const L = 48, Rm = 10, T = 22, B = 28;
    ctx.clearRect(0, 0, W, H);
    ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, W, H);
    const t = dates.map((d) => Date.parse(d));
    const all = [];
    values.forEach((v, k) => { if (v !== null) { all.push(v - (std && std[k] ? std[k] : 0), v + (std && std[k] ? std[k] : 0)); } });
    if (line) line.forEach((v) => v !== null && all.push(v));
    let lo = Math.min(...all) * scale, hi = Math.max(...all) * scale;
    if (!Number.isFinite(lo)) { lo = -1; hi = 1; }
    if (hi - lo < 1e-6) { lo -= 1; hi += 1; }
    const pad = 0.06 * (hi - lo); lo -= pad; hi += pad;
    const t0 = t[0], t1 = t[t.length - 1] > t0 ? t[t.length - 1] : t0 + 1;
    const X = (ms) => L + ((ms - t0) / (t1 - t0)) * (W - L - Rm);
    const Y = (v) => T + (1 - (v * scale - lo) / (hi - lo)) * (H - T - B);
    ctx.strokeStyle = "#ccc"; ctx.fillStyle = "#444"; ctx.font = "11px sans-serif"; ctx.lineWidth = 1;
    const step = niceStep(hi - lo);
    for (let v = Math.ceil(lo / step) * step; v <= hi; v += step) {
      const py = T + (1 - (v - lo) / (hi - lo)) * (H - T - B);
      ctx.beginPath(); ctx.moveTo(L, py); ctx.lineTo(W - Rm, py); ctx.stroke();
      ctx.fillText(+v.toPrecision(3) + "", 4, py + 4);
    }
    const y0 = new Date(t0).getUTCFullYear(), y1 = new Date(t1).getUTCFullYear();
    for (let year = y0; year <= y1 + 1; year++) {
      for (const month of [0, 6]) {
        const ms = Date.UTC(year, month, 1);
        if (ms < t0 || ms > t1) continue;
        const px = X(ms);
        ctx.beginPath(); ctx.moveTo(px, T); ctx.lineTo(px, H - B); ctx.stroke();
        ctx.fillText(year + (month ? "-07" : "-01"), px - 20, H - B + 14);
      }
    }
    ctx.fillText(title, L, 14);
    ctx.strokeStyle = "#555";
    if (std) {
      values.forEach((v, k) => {
        if (v === null || !std[k]) return;
        ctx.beginPath(); ctx.moveTo(X(t[k]), Y(v - std[k])); ctx.lineTo(X(t[k]), Y(v + std[k])); ctx.stroke();
      });
    }
    if (line) {
      ctx.strokeStyle = "#c0392b"; ctx.lineWidth = 1.8; ctx.beginPath();
      line.forEach((v, k) => { if (v !== null) (k ? ctx.lineTo(X(t[k]), Y(v)) : ctx.moveTo(X(t[k]), Y(v))); });
      ctx.stroke(); ctx.lineWidth = 1;
    }
    ctx.fillStyle = "#1f4e8c";
    values.forEach((v, k) => { if (v !== null) { ctx.beginPath(); ctx.arc(X(t[k]), Y(v), 2.6, 0, 2 * Math.PI); ctx.fill(); } });
  }

  const LABELS = { velocity: ["velocity", 1e3, "mm/yr"], velocity_std: ["velocity std", 1e3, "mm/yr"],
    height_error: ["height error", 1, "m"], height_error_std: ["height error std", 1, "m"],
    temporal_coherence: ["temporal coherence", 1, ""], scatterer: ["scatterer", 0, ""],
    model_choice: ["model", 0, ""], displacement_std: ["displacement std", 0, ""] };

  function showPoint(point) {
    const info = $("info");
    if (!point) {
      info.textContent = "No point within " + PICK_PIXELS + " pixels that passes the filters.";
      state.picked = null; drawOverlay(); return;
    }
    const xy = lonLatToMap(point.lon, point.lat);
    state.picked = { x: xy[0], y: xy[1], index: point.index };
    let rows = "";
    for (const name of QUANTITIES) {
      const [label, factor, unit] = LABELS[name];
      if (name === "displacement_std") {
        rows += "<tr><td>" + label + "</td><td" + (point.displacement_std ? ">error bars (1σ)" : " class=absent>absent from this result") + "</td></tr>";
        continue;
      }
      if (!(name in point.values)) { rows += "<tr><td>" + label + "</td><td class=absent>absent from this result</td></tr>"; continue; }
      const v = point.values[name];
      const text = v === null ? "no value" : factor ? (v * factor).toPrecision(4) + " " + unit : String(v);
      rows += "<tr><td>" + label + "</td><td>" + text + "</td></tr>";
    }
    info.innerHTML = "<b>point " + (point.id || point.index) + "</b> (index " + point.index + ") at " +
      point.lon.toFixed(6) + "°, " + point.lat.toFixed(6) + "°<table>" + rows + "</table>" +
      "<div class=hint>line: " + point.model_says + "</div>";
    drawSeries("displacement (mm)", state.meta.dates, point.displacement, point.displacement_std, point.model_line, 1e3);
    $("series-values").textContent = JSON.stringify({ kind: "point", index: point.index, displacement: point.displacement,
      displacement_std: point.displacement_std, model_line: point.model_line });
    document.body.dataset.pickedIndex = point.index;
    drawOverlay();
  }

  function showBox(answer) {
    const info = $("info");
    if (!answer.count) { info.textContent = "No points in the box that pass the filters."; }
    else {
      info.innerHTML = "<b>box: " + answer.count + " points</b>" +
        (answer.averaged < answer.count ? " (mean of an even sample of " + answer.averaged + ")" : "") +
        "<div class=hint>mean series; bars: the points' standard deviation</div>";
      drawSeries("mean displacement of " + answer.count + " points (mm)", state.meta.dates, answer.mean, answer.std, null, 1e3);
    }
    $("series-values").textContent = JSON.stringify({ kind: "box", count: answer.count, mean: answer.mean });
    document.body.dataset.boxCount = answer.count;
  }

  // ------------------------------------------------------------------------ events
  function bindEvents() {
    const overlay = $("overlay");
    overlay.addEventListener("mousedown", (e) => {
      state.drag = { x: e.offsetX, y: e.offsetY, cx: state.view.cx, cy: state.view.cy, box: e.shiftKey, moved: false };
    });
    let hoverAt = null;
    overlay.addEventListener("mousemove", (e) => {
      if (state.drag) return;
      if (hoverAt === null) requestAnimationFrame(() => { hover(hoverAt[0], hoverAt[1]); hoverAt = null; });
      hoverAt = [e.offsetX, e.offsetY];
    });
    overlay.addEventListener("mouseleave", () => { $("tooltip").hidden = true; });
    window.addEventListener("mousemove", (e) => {
      const d = state.drag;
      if (!d) return;
      $("tooltip").hidden = true;
      const rect = overlay.getBoundingClientRect(), ex = e.clientX - rect.left, ey = e.clientY - rect.top;
      if (Math.abs(ex - d.x) + Math.abs(ey - d.y) > 3) d.moved = true;
      if (d.box) {
        const [a, b] = toMap(d.x, d.y), [c, f] = toMap(ex, ey);
        state.box = [a, b, c, f]; drawOverlay();
      } else if (d.moved) {
        state.view.cx = d.cx - (ex - d.x) / state.view.scale;
        state.view.cy = d.cy + (ey - d.y) / state.view.scale;
        schedule();
      }
    });
    window.addEventListener("mouseup", async (e) => {
      const d = state.drag;
      state.drag = null;
      if (!d) return;
      const rect = overlay.getBoundingClientRect(), ex = e.clientX - rect.left, ey = e.clientY - rect.top;
      if (d.box && d.moved) {
        const [a, b] = toMap(d.x, d.y), [c, f] = toMap(ex, ey);
        state.box = [a, b, c, f]; drawOverlay();
        showBox(await boxSeries(a, b, c, f));
      } else if (!d.moved) {
        const [x, y] = toMap(ex, ey);
        showPoint(await pick(x, y, PICK_PIXELS / state.view.scale));
      }
    });
    overlay.addEventListener("wheel", (e) => {
      e.preventDefault();
      const [x, y] = toMap(e.offsetX, e.offsetY), factor = Math.pow(1.2, -e.deltaY / 100);
      state.view.scale *= factor;
      state.view.cx = x - (x - state.view.cx) / factor;
      state.view.cy = y - (y - state.view.cy) / factor;
      schedule();
    }, { passive: false });
    window.addEventListener("resize", () => { resize(); schedule(); });
    $("column").addEventListener("change", async (e) => {
      await column(e.target.value); setColumn(e.target.value, false); schedule();
    });
    for (const id of ["low", "high"]) {
      $(id).addEventListener("change", () => {
        const lo = parseFloat($("low").value), hi = parseFloat($("high").value);
        if (Number.isFinite(lo) && Number.isFinite(hi) && hi > lo) { state.low = lo; state.high = hi; }
        setColumn(state.column, true); schedule();
      });
    }
    $("reset-range").addEventListener("click", () => { setColumn(state.column, false); schedule(); });
    $("min-coherence").addEventListener("input", (e) => {
      const v = parseFloat(e.target.value); state.minCoherence = Number.isFinite(v) ? v : 0;
      state.mask = null; schedule();
    });
    $("basemap-on").addEventListener("change", (e) => { state.basemap = e.target.checked; schedule(); });
  }

  function checkboxes(containerId, label, names, key) {
    const box = $(containerId);
    if (!names) { box.innerHTML = label + ": <span class=absent>absent from this result</span>"; return; }
    box.innerHTML = label + ": ";
    names.forEach((name, code) => {
      const item = document.createElement("label");
      item.innerHTML = '<input type="checkbox" checked data-code="' + code + '"> ' + name + " ";
      box.appendChild(item);
    });
    box.addEventListener("change", () => {
      const on = [...box.querySelectorAll("input")].filter((i) => i.checked).map((i) => +i.dataset.code);
      state[key] = on.length === names.length ? null : new Set(on);
      state.mask = null; schedule();
    });
  }

  // ------------------------------------------------------------------------ start
  async function start() {
    state.meta = EMBEDDED ? EMBEDDED.meta : await fetchJSON("api/meta");
    const m = state.meta;
    $("source").textContent = m.source + (m.sampled_from ? " (a sample of " + m.n_points + " of " + m.sampled_from + " points)" : "");
    $("total-count").textContent = m.n_points;
    const select = $("column");
    for (const c of m.columns) {
      const option = document.createElement("option");
      option.value = c.name; option.textContent = c.name + (c.units ? " (" + c.units + ")" : "");
      select.appendChild(option);
    }
    select.value = m.default_column;
    const wanted = ["x", "y", m.default_column];
    if (m.has_coherence) wanted.push("temporal_coherence");
    if (m.kinds) wanted.push("scatterer");
    if (m.models) wanted.push("model_choice");
    if (EMBEDDED) for (const c of m.columns) wanted.push(c.name);
    await Promise.all([...new Set(wanted)].map(column));
    if (!m.has_coherence) $("coherence-row").innerHTML = "temporal coherence: <span class=absent>absent from this result</span>";
    checkboxes("kinds", "scatterer", m.kinds, "kinds");
    checkboxes("models", "model", m.models, "models");
    resize();
    fitView();
    setColumn(m.default_column, false);
    bindEvents();
    draw();
    const series = $("series").getContext("2d");
    series.fillStyle = "#888"; series.font = "13px sans-serif";
    series.fillText("Click a point for its series; shift+drag for a box's mean.", 16, 30);
  }

  window.depsiView = {
    state,
    // draw the whole map now; the milliseconds it took
    redraw() { const began = performance.now(); draw(); return performance.now() - began; },
    // where a lon/lat point is on the map, in page pixels (for tests and scripts)
    project(lon, lat) {
      const [x, y] = lonLatToMap(lon, lat), [a, b] = toScreen(x, y), rect = $("overlay").getBoundingClientRect();
      return [a + rect.left, b + rect.top];
    },
  };
  start().catch((err) => {
    document.body.dataset.error = String(err);
    $("info").textContent = "The viewer could not start: " + err;
    throw err;
  });
})();
