"""Agent frameworks on Sandman, unchanged (issue 14): a mini-swe-agent environment
(``mini_swe_agent``) and a SWE-ReX deployment and runtime (``swe_rex``).

Optional: these modules import the frameworks themselves, so they are installed with the
``agents`` extra (``pip install 'sandman[agents]'``) and imported only by users who want
them; nothing else in Sandman imports this package.
"""
