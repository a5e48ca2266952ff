# bench/programs/objects.py: Python object churn for the programs set of
# bench/run. Builds 100k small records (dicts, lists, tuples, strings),
# serialises them to JSON and parses it back three times, then sorts them.
# Run with PYTHONMALLOC=malloc every object comes from malloc; without it,
# CPython's own pool allocator serves objects up to 512 B.
import json

records = [{"id": i, "name": str(i) * 3, "tags": [i, i + 1, (i, str(i))]} for i in range(100000)]
text = json.dumps(records)
for _ in range(3):
    parsed = json.loads(text)
parsed.sort(key=lambda r: r["name"])
print(len(text), len(parsed), parsed[0]["id"])
