// gpudoc's HTML report: draws the charts with uPlot from the data the page carries, and links each
// diagnosis to its GPU's chart, process and moment.
(function () {
  "use strict";
  var errors = [];
  window.addEventListener("error", function (e) {
    errors.push(String(e.message));
    document.body.dataset.errors = errors.join(" | ");
  });

  var data = JSON.parse(document.getElementById("gpudoc-data").textContent);
  var charts = [];
  var highlight = null; // {gpu, pid, at, id}

  function css(name) {
    return getComputedStyle(document.documentElement).getPropertyValue(name).trim();
  }
  function alpha(color, a) {
    // #rrggbb to rgba
    var m = /^#([0-9a-f]{2})([0-9a-f]{2})([0-9a-f]{2})$/i.exec(color);
    if (!m) return color;
    return "rgba(" + parseInt(m[1], 16) + "," + parseInt(m[2], 16) + "," + parseInt(m[3], 16) + "," + a + ")";
  }
  var JOB = ["#4263eb", "#2f9e44", "#ae3ec9", "#1098ad", "#f08c00", "#e8590c", "#5c940d", "#d6336c",
             "#364fc7", "#0c8599", "#9c36b5", "#66a80f", "#868e96"];

  function fmtMiB(v) {
    if (v == null || isNaN(v)) return "–";
    var a = Math.abs(v);
    if (a >= 1024 * 1024) return (v / 1048576).toFixed(2) + " TiB";
    if (a >= 1024) return (v / 1024).toFixed(2) + " GiB";
    if (a >= 1) return v.toFixed(2) + " MiB";
    if (a > 0) return (v * 1024).toFixed(0) + " KiB";
    return "0 B";
  }
  function fmtS(s) {
    if (s == null) return "–";
    if (s < 60) return s.toFixed(s < 10 ? 3 : 2) + " s";
    var m = Math.floor(s / 60);
    if (m < 60) return m + " min " + (s - m * 60).toFixed(1) + " s";
    var h = Math.floor(m / 60);
    return h + " h " + (m - h * 60) + " min " + (s - m * 60).toFixed(0) + " s";
  }
  // Tick steps in MiB: round numbers of bytes (powers of two, then 5, 10, 20, 40 ... GiB).
  var INCRS = [0.25, 0.5, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 5120, 10240, 20480, 40960,
               81920, 163840, 327680, 655360, 1310720, 2621440];
  function tickS(v) {
    if (v == null) return "";
    if (v < 60) return (+v.toFixed(3)) + " s";
    var m = Math.floor(v / 60), sec = +(v - m * 60).toFixed(1);
    return m + ":" + (sec < 10 ? "0" : "") + sec;
  }
  function byteAxis(theme) {
    return {
      stroke: theme.fg, grid: { stroke: theme.grid }, ticks: { stroke: theme.grid }, size: 84,
      incrs: INCRS, values: function (u, vals) { return vals.map(fmtMiB); }
    };
  }

  // Wheel zooms at the cursor, shift-drag pans; drag-select zooms and double-click resets (uPlot's own).
  function zoomPan(range) {
    return {
      hooks: {
        ready: function (u) {
          var over = u.over;
          function clamp(min, max) {
            var w = max - min, full = range[1] - range[0];
            if (w >= full) return [range[0], range[1]];
            if (min < range[0]) { min = range[0]; max = min + w; }
            if (max > range[1]) { max = range[1]; min = max - w; }
            return [min, max];
          }
          over.addEventListener("wheel", function (e) {
            e.preventDefault();
            var x = u.posToVal(u.cursor.left == null ? u.bbox.width / 2 : u.cursor.left, "x");
            var f = e.deltaY < 0 ? 0.8 : 1.25;
            var min = u.scales.x.min, max = u.scales.x.max;
            var r = clamp(x - (x - min) * f, x + (max - x) * f);
            if (r[1] - r[0] > 1e-6) u.setScale("x", { min: r[0], max: r[1] });
          }, { passive: false });
          over.addEventListener("mousedown", function (e) {
            if (!e.shiftKey) return;
            e.preventDefault();
            e.stopImmediatePropagation();
            var x0 = e.clientX, min0 = u.scales.x.min, max0 = u.scales.x.max;
            var per = (max0 - min0) / over.getBoundingClientRect().width;
            function move(e2) {
              var d = (e2.clientX - x0) * per, r = clamp(min0 - d, max0 - d);
              u.setScale("x", { min: r[0], max: r[1] });
            }
            function up() {
              document.removeEventListener("mousemove", move);
              document.removeEventListener("mouseup", up);
            }
            document.addEventListener("mousemove", move);
            document.addEventListener("mouseup", up);
          }, true);
        }
      }
    };
  }

  // Counts the pixels drawn in the plot, so a test can tell a chart from an empty canvas.
  function inked(u, el) {
    try {
      var c = u.ctx, w = c.canvas.width, h = c.canvas.height;
      var px = c.getImageData(0, 0, w, h).data, n = 0;
      for (var i = 3; i < px.length; i += 16) if (px[i] > 0) n++;
      el.dataset.ink = String(n);
    } catch (e) {
      el.dataset.ink = "unknown";
    }
  }

  function drawMarks(g, theme) {
    return function (u) {
      var c = u.ctx, top = u.bbox.top, h = u.bbox.height, dpr = devicePixelRatio || 1;
      c.save();
      // Optimizer steps: ticks along the bottom when they can be told apart.
      var min = u.scales.x.min, max = u.scales.x.max;
      var visible = g.steps.filter(function (s) { return s >= min && s <= max; });
      if (visible.length && visible.length <= u.bbox.width / (4 * dpr)) {
        c.strokeStyle = theme.dim;
        c.lineWidth = dpr;
        c.beginPath();
        visible.forEach(function (s) {
          var x = Math.round(u.valToPos(s, "x", true)) + 0.5;
          c.moveTo(x, top + h);
          c.lineTo(x, top + h - 6 * dpr);
        });
        c.stroke();
      }
      // The GPU's capacity, when the view reaches it.
      var cy = null;
      if (g.total_mib <= u.scales.y.max) {
        cy = Math.round(u.valToPos(g.total_mib, "y", true)) + 0.5;
        c.strokeStyle = theme.capacity;
        c.lineWidth = dpr;
        c.setLineDash([8 * dpr, 4 * dpr]);
        c.beginPath();
        c.moveTo(u.bbox.left, cy);
        c.lineTo(u.bbox.left + u.bbox.width, cy);
        c.stroke();
        c.setLineDash([]);
        c.fillStyle = theme.capacity;
        c.font = (11 * dpr) + "px system-ui, sans-serif";
        c.textAlign = "right";
        c.fillText("capacity " + fmtMiB(g.total_mib), u.bbox.left + u.bbox.width - 4 * dpr, cy + 14 * dpr);
        c.textAlign = "left";
        u.root.dataset.capacity = String(Math.round(cy));
      }
      var colors = { oom: theme.bad, lost: theme.warn, end: theme.dim };
      g.marks.forEach(function (m) {
        if (m.at < min || m.at > max) return;
        var x = Math.round(u.valToPos(m.at, "x", true)) + 0.5;
        c.strokeStyle = colors[m.kind] || theme.dim;
        c.lineWidth = (m.kind === "oom" ? 2 : 1) * dpr;
        c.setLineDash(m.kind === "end" ? [4 * dpr, 4 * dpr] : []);
        c.beginPath();
        c.moveTo(x, top);
        c.lineTo(x, top + h);
        c.stroke();
        if (m.kind !== "end") {
          c.fillStyle = colors[m.kind];
          c.font = (12 * dpr) + "px system-ui, sans-serif";
          var text = m.text.length > 60 ? m.text.slice(0, 59) + "…" : m.text;
          var tw = c.measureText(text).width;
          // Right of its line, or left of it at the chart's right edge (an OOM ends the run there), and
          // below the capacity line and its label when they run along the top.
          var lx = x + 4 * dpr + tw <= u.bbox.left + u.bbox.width ? x + 4 * dpr : x - 4 * dpr - tw;
          var ly = top + 14 * dpr;
          if (cy != null && cy < ly + 4 * dpr + 17 * dpr) ly = cy + 32 * dpr;
          c.fillText(text, Math.max(u.bbox.left, lx), ly);
          u.root.dataset["label" + m.kind] = [lx, ly - 12 * dpr, tw, 15 * dpr].map(Math.round).join(" ");
        }
      });
      if (highlight && highlight.gpu === g.label && highlight.at != null &&
          highlight.at >= min && highlight.at <= max) {
        var hx = u.valToPos(highlight.at, "x", true);
        c.setLineDash([]);
        c.fillStyle = alpha(theme.accent, 0.25);
        c.fillRect(hx - 5 * dpr, top, 10 * dpr, h);
      }
      c.restore();
    };
  }

  function timelineChart(el, g, theme, width) {
    var x = g.x, n = x.length;
    var series = [{ label: "time", value: function (u, v) { return fmtS(v); } }];
    var values = [x];
    var bands = [];
    var raw = [null];
    var job = g.series.filter(function (s) { return s.kind === "job"; });
    // The job's processes stacked: each band lies on the ones before it.
    var below = null;
    job.forEach(function (s, k) {
      var stacked = new Array(n);
      for (var i = 0; i < n; i++) {
        var v = s.values[i];
        var b = below ? below[i] : 0;
        stacked[i] = v == null ? (below ? b : null) : (b || 0) + v;
      }
      var color = JOB[k % JOB.length];
      series.push({
        label: s.label, stroke: color, width: 1, fill: alpha(color, 0.28), pid: s.pid,
        paths: uPlot.paths.stepped({ align: 1 }),
        value: (function (vals) { return function (u, v, si, idx) { return fmtMiB(idx == null ? null : vals[idx]); }; })(s.values)
      });
      values.push(stacked);
      raw.push(s.values);
      if (below) bands.push({ series: [series.length - 1, series.length - 2], fill: alpha(color, 0.28) });
      below = stacked;
    });
    if (job.length > 1) {
      // The first band fills to zero on its own; the others fill between themselves and the one below.
      for (var j = 2; j < series.length; j++) series[j].fill = undefined;
    }
    g.series.forEach(function (s) {
      if (s.kind === "job") return;
      var color = { device: theme.device, other: theme.other, reserved: theme.reserved,
                    allocated: theme.allocated }[s.kind];
      series.push({
        label: s.label, stroke: color, width: s.kind === "device" ? 1.5 : 1.25, pid: s.pid,
        dash: s.kind === "allocated" ? [6, 3] : s.kind === "other" ? [2, 2] : undefined,
        paths: uPlot.paths.stepped({ align: 1 }), spanGaps: s.kind === "reserved" || s.kind === "allocated",
        value: function (u, v) { return fmtMiB(v); }
      });
      values.push(s.values);
    });
    var range = [0, n ? x[n - 1] : 1];
    var opts = {
      width: width, height: 320, series: series, bands: bands,
      scales: { x: { time: false }, y: { range: function (u, min, max) { return [0, Math.max(max * 1.08, 1)]; } } },
      axes: [{ stroke: theme.fg, grid: { stroke: theme.grid }, ticks: { stroke: theme.grid },
               values: function (u, vals) { return vals.map(tickS); } },
             byteAxis(theme)],
      cursor: { drag: { x: true, y: false }, focus: { prox: 24 } },
      focus: { alpha: 0.25 },
      legend: { live: true },
      plugins: [zoomPan(range)],
      hooks: { draw: [drawMarks(g, theme), function (u) { inked(u, el); }] }
    };
    var u = new uPlot(opts, values, el);
    u.gpudoc = { gpu: g.label, kind: "timeline" };
    return u;
  }

  function stepChart(el, s, theme, width) {
    var line = function (label, color, dash) {
      return { label: label, stroke: color, width: 1.5, dash: dash, value: function (u, v) { return fmtMiB(v); } };
    };
    var opts = {
      width: width, height: 220,
      series: [{ label: "step" },
               line("allocated", theme.allocated),
               line("reserved", theme.reserved),
               line("step peak allocated", theme.allocated, [5, 3]),
               line("step peak reserved", theme.reserved, [5, 3])],
      scales: { x: { time: false } },
      // Steps are whole: ticks only at whole steps (uPlot's own increments include 2.5).
      axes: [{ stroke: theme.fg, grid: { stroke: theme.grid }, ticks: { stroke: theme.grid }, label: "optimizer step",
               incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1e3, 2e3, 5e3, 1e4, 2e4, 5e4, 1e5, 2e5, 5e5, 1e6, 1e7] },
             byteAxis(theme)],
      cursor: { drag: { x: true, y: false } },
      plugins: [zoomPan([s.step[0], s.step[s.step.length - 1]])],
      hooks: { draw: [function (u) { inked(u, el); el.dataset.ticks = (u.axes[0]._splits || []).join(" "); }] }
    };
    var u = new uPlot(opts, [s.step, s.allocated, s.reserved, s.peak_allocated, s.peak_reserved], el);
    u.gpudoc = { gpu: s.gpu, pid: s.pid, kind: "steps" };
    return u;
  }

  function theme() {
    var t = {};
    ["fg", "dim", "grid", "bad", "warn", "accent", "device", "other", "reserved", "allocated", "capacity"]
      .forEach(function (k) { t[k] = css("--" + k); });
    return t;
  }

  function build(width) {
    charts.forEach(function (u) { u.destroy(); });
    charts = [];
    var t = theme();
    data.gpus.forEach(function (g) {
      var box = document.querySelector('.gpu[data-gpu="' + CSS.escape(g.label) + '"]');
      if (!box || !box.querySelector(".chart.timeline")) return;
      var w = width || box.clientWidth || 900;
      var el = box.querySelector(".chart.timeline");
      el.textContent = "";
      charts.push(timelineChart(el, g, t, w));
      var steps = box.querySelector(".steps");
      steps.textContent = "";
      data.steps.filter(function (s) { return s.gpu === g.label; }).forEach(function (s) {
        var h = document.createElement("h4");
        h.textContent = "PyTorch, " + s.label + ", by optimizer step";
        var div = document.createElement("div");
        div.className = "chart";
        div.dataset.pid = s.pid;
        steps.appendChild(h);
        steps.appendChild(div);
        charts.push(stepChart(div, s, t, w));
      });
    });
    if (highlight) apply();
    document.body.dataset.charts = String(charts.length);
  }

  // Shows diagnosis `i`: its GPU's chart, the moment (zoomed out if it was off screen), its process.
  function show(i, scroll) {
    var d = data.diagnoses[i];
    if (!d || !d.gpu) return;
    document.querySelectorAll(".diag.active").forEach(function (e) { e.classList.remove("active"); });
    var card = document.getElementById("diag-" + i);
    if (card) card.classList.add("active");
    highlight = { gpu: d.gpu, pid: d.pid, at: d.at, id: "diag-" + i };
    apply();
    var box = document.querySelector('.gpu[data-gpu="' + CSS.escape(d.gpu) + '"]');
    if (box && scroll) box.scrollIntoView({ block: "center" });
  }

  function apply() {
    document.querySelectorAll(".gpu").forEach(function (b) {
      var on = highlight && b.dataset.gpu === highlight.gpu;
      b.classList.toggle("highlight", !!on);
      if (on) b.dataset.highlight = highlight.id; else delete b.dataset.highlight;
    });
    charts.forEach(function (u) {
      if (!highlight || u.gpudoc.gpu !== highlight.gpu) return;
      if (u.gpudoc.kind === "timeline" && highlight.at != null &&
          (highlight.at < u.scales.x.min || highlight.at > u.scales.x.max)) {
        u.setScale("x", { min: u.data[0][0], max: u.data[0][u.data[0].length - 1] });
      }
      if (highlight.pid != null) {
        var idx = u.series.findIndex(function (s) { return s.pid === highlight.pid; });
        if (idx > 0) u.setSeries(idx, { focus: true });
      }
      u.redraw(false);
    });
  }

  document.querySelectorAll(".diag.linked").forEach(function (card) {
    var i = Number(card.id.slice(5));
    card.addEventListener("click", function (e) {
      if (e.target.tagName === "A" && !e.target.classList.contains("show")) return;
      e.preventDefault();
      history.replaceState(null, "", "#diag-" + i);
      show(i, true);
    });
    card.addEventListener("keydown", function (e) { if (e.key === "Enter") show(i, true); });
  });

  build();
  var m = /^#diag-(\d+)$/.exec(location.hash);
  if (m) show(Number(m[1]), true);

  var resizing = null;
  window.addEventListener("resize", function () {
    clearTimeout(resizing);
    resizing = setTimeout(function () { build(); }, 150);
  });
  if (window.matchMedia) {
    window.matchMedia("(prefers-color-scheme: dark)").addEventListener("change", function () { build(); });
  }
  window.addEventListener("beforeprint", function () {
    document.documentElement.classList.add("printing");
    build(680);
  });
  window.addEventListener("afterprint", function () {
    document.documentElement.classList.remove("printing");
    build();
  });
  // A table cell other than a command's that wraps: a long command squeezed the table (said for tests).
  var squeezed = [];
  document.querySelectorAll("#processes table").forEach(function (t) {
    t.querySelectorAll("td:not(:last-child)").forEach(function (td) {
      // A cell stretches to its row's height: its text's lines are what tell.
      var range = document.createRange();
      range.selectNodeContents(td);
      var tops = {};
      Array.prototype.forEach.call(range.getClientRects(), function (r) { tops[Math.round(r.top)] = 1; });
      if (Object.keys(tops).length > 1) squeezed.push(td.textContent);
    });
  });
  if (squeezed.length) document.body.dataset.squeezed = squeezed.slice(0, 5).join(" | ");
  document.body.dataset.ready = "1";
})();
