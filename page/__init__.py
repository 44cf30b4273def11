"""The goose-lens page: its layout (``page.layout``), its events (``page.events``), its handlers (``page.generate``,
``page.cycles``, ``page.traces``, ``page.race``, ``page.sweep``, ``page.models``), the contract between the two
(``page.contract``), the ZeroGPU glue (``page.zerogpu``) and its CSS and JavaScript (``page/assets``, read by
``page.static``).  ``app.py`` builds it (``page.layout.build_demo``) and launches it.
"""
