() => { const e = document.getElementById('draft-tree'); if (!e) return;
  const plot = e.querySelector('.js-plotly-plot'); if (!plot) return;
  const w = plot.offsetWidth, h = plot.offsetHeight;
  e.style.setProperty('--tree-w', w + 'px');
  e.style.setProperty('--tree-zoom', Math.min(screen.width / w, screen.height / h).toFixed(3));
  e.requestFullscreen(); }
