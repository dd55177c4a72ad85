"""Tooling, not the product: a verifying, deduplicating receiver to develop and test against
(``receiver``), the end-to-end demo (``demo``) and its request-rate chart (``chart``). May
import anything below ``cli``.
"""
