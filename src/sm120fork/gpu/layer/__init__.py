"""The GPU layer harness: SGLang's own fused-norm layer path, rank against rank.

:mod:`.cases` runs one case in a fresh group of rank processes (:mod:`.rank`, started
beside the SGLang tree under test) and judges what they report; :mod:`.run` runs a plan of
cases on one or more install routes and writes the report and the record.
"""
