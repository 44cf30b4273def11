() => { document.addEventListener('keydown', (e) => {
  const box = e.target;
  if (e.key === 'Enter' && box.matches && box.matches('#cycle-scrubber input[type=number]')) box.blur();
}, true); }
