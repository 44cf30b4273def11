() => { setInterval(() => {
  const gd = document.querySelector('#sweep-plot .js-plotly-plot');
  if (!gd || !gd.on || !gd._ev || gd._ev.gooseClicks) return;
  gd._ev.gooseClicks = true;
  gd.on('plotly_click', (ev) => {
    const point = (ev.points || []).find(p => Number.isInteger(p.customdata)); if (!point) return;
    const choice = document.querySelectorAll('#sweep-open label')[point.customdata];
    if (choice) choice.click();
  });
}, 400); }
