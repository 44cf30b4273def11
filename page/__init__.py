"""The goose-lens page: its layout (``page.layout``), its events (``page.events``), its handlers (``page.generate``,
``page.cycles``, ``page.traces``, ``page.race``, ``page.sweep``, ``page.models``) and what the run handlers share
(``page.setup``, ``page.frames``), the contract between the two (``page.contract``), the visitor's settings and the
page's policies (``page.settings``, ``page.policy``), the ZeroGPU glue (``page.zerogpu``) and its CSS and JavaScript
(``page/assets``, read by ``page.static``).  ``app.py`` builds it (``page.layout.build_demo``) and launches it.
"""
