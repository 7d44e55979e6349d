"""Workload file formats: one reader per module, each turning one record into a `Question`.

lines.py      the record sources (JSONL, a streamed JSON array, CSV rows, text lines) and the bad-line policy
spec_bench.py Spec-Bench question.jsonl (the format the built-in set uses)
sharegpt.py   ShareGPT conversations (`conversations` / `from` / `value`), JSON array or JSONL
chat.py       OpenAI chat JSONL (`messages`, optional `max_tokens`, reference / answer field)
csv_prompts.py CSV with a prompt column
text.py       plain text, one prompt per line
trace.py      timed request traces (Mooncake-style `timestamp` / `input_length` / `output_length`)
detect.py     FORMAT:PATH names and detection from the first record
"""
