"""The page's help text: how to read the tree, the numbers and the scrubber."""
from __future__ import annotations

from engine.decoding.config import DecodeConfig
from engine.sources import REGISTRY
from viz.frame_text import SHOWN

HOW_TO_READ = f"""
* **The tree** is one verification forward. The root is the *anchor* (the last committed token) and depth
  grows to the right. Hover a node for its token, score, estimated acceptance and, for a rejected node, the
  token the model wanted in its place. Each other node is a draft token, coloured by its source:
{chr(10).join(f"  * **{i.label}**: {i.blurb}" for i in REGISTRY)}
* **The thick sky-blue path** is what the model accepted; the **star** is the bonus token the model adds itself.
  Faded nodes were rejected; ghost nodes were never verified (the GT principle judged them not worth a row).
  **+N** folds N rejected side nodes and **⋯N** N tokens of a long chain (a spine's middle with the branches
  off it; spine tokens never go into a +N), so the tree fits the screen: hover them for their tokens.
* **Run totals and the cycle on screen:** the big numbers, the stats line and the theory panel's measured rates
  are the whole run so far; the line under the tree, its sentence, the tree and the theory panel's bound are the
  cycle on the scrubber.
* **Max depth D** bounds the TR branches only. The PLD spine copies up to {DecodeConfig().tree.max_spine} tokens of a
  match, a confident match is extended further (up to {DecodeConfig().variant.max_extended_chain} × its confidence, and
  no further than a forward of {DecodeConfig().gt.chain_steps:g} AR steps on the cost curve allows), and
  **bypass chains** likewise: none of them is bounded by D.
* **τ** is tokens committed per verification forward (AR = 1). **tokens/s** counts engine time only: the
  time the page spends drawing is not counted.
* **The scrubber** (◀ ▶, drag, arrow keys or a typed number) steps through every recorded cycle; clicking a
  token in the output jumps to its cycle, and the tokens of the cycle on screen are marked {SHOWN!r}.
* **Greedy** (temperature 0) output in fp32 (the exact mode) is token for token the output of plain AR decoding.
  In bf16, fp16 or q4 a forward over many tree rows rounds differently from AR's one-token step, so where two
  next tokens are almost equally likely a run may part from AR's text: a *precision tie*, not a bug; the Race
  and the Sweep say, for every run that parts, whether it is a tie or a bug.  **Sampling** output has exactly
  the distribution of plain AR sampling.
* **Sweep** runs the prompt once per value of one parameter (B, r, D, c, method or sources) and plots τ,
  tokens/s and the speedup over AR (AR timed before and after the runs: the faster) against the value; it says
  whether every run produced AR's text; click a point to open its run in the tree viewer (`python -m cli.sweep`
  sweeps from a shell).
"""
