"""SGLang's request-metrics file, as FileRequestMetricsExporter writes it
(python/sglang/srt/observability/request_metrics_exporter.py, sgl-project/
sglang main 8905cbd, after v0.5.15; unchanged since ba6b501), reproduced for
tests from reading it (no SGLang code copied):

* DIR/sglang-request-metrics-{datetime.now():%Y%m%d_%H}.log, opened in
  append mode when the hour suffix differs from the open file's (the old
  one is closed: a new file per hour, nothing renamed or deleted);
* one record a line: json.dump of
  {"request_parameters": json.dumps(<every field of the request that is
  not None, in declaration order, without image/video/audio data and
  input_embeds>), **<meta_info without the out_skip_names>}, then "\\n",
  then flush();
* a request whose rid contains "HEALTH_CHECK" is not written.
"""
import datetime
import json
import os

HEALTH_CHECK_RID_PREFIX = "HEALTH_CHECK"
ALWAYS_EXCLUDE_FIELDS = {"image_data", "video_data", "audio_data",
                         "input_embeds"}


def file_name(when):
    return f"sglang-request-metrics-{when.strftime('%Y%m%d_%H')}.log"


class FileExporter:
    """now: a callable returning a datetime (datetime.now in SGLang; a test
    turns the hour with it)."""

    def __init__(self, export_dir, now=datetime.datetime.now,
                 obj_skip_names=(), out_skip_names=()):
        self.export_dir = export_dir
        os.makedirs(export_dir, exist_ok=True)
        self.now = now
        self.obj_skip_names = set(obj_skip_names)
        self.out_skip_names = set(out_skip_names)
        self._fh = None
        self._suffix = None
        self.written = 0

    def _ensure_file(self, suffix):
        if suffix != self._suffix:
            if self._fh is not None:
                self._fh.close()
            self._fh = open(os.path.join(
                self.export_dir, f"sglang-request-metrics-{suffix}.log"),
                "a", encoding="utf-8")
            self._suffix = suffix

    def format_output_data(self, obj, out_dict):
        """obj: the request's fields in declaration order (a dict standing
        for the GenerateReqInput dataclass)."""
        params = {k: v for k, v in obj.items()
                  if k not in self.obj_skip_names
                  and k not in ALWAYS_EXCLUDE_FIELDS and v is not None}
        meta = out_dict.get("meta_info", {})
        return {"request_parameters": json.dumps(params),
                **{k: v for k, v in meta.items()
                   if k not in self.out_skip_names}}

    def write_record(self, obj, out_dict, pause=None):
        """Writes one record. pause: called between the first half of the
        line and the rest (each flushed), as json.dump's writes of a large
        record reach the file in pieces."""
        rid = obj.get("rid")
        if isinstance(rid, str) and HEALTH_CHECK_RID_PREFIX in rid:
            return
        self._ensure_file(self.now().strftime("%Y%m%d_%H"))
        text = json.dumps(self.format_output_data(obj, out_dict))
        if pause is not None:
            half = len(text) // 2
            self._fh.write(text[:half])
            self._fh.flush()
            pause()
            text = text[half:]
        self._fh.write(text)
        self._fh.write("\n")
        self._fh.flush()
        self.written += 1

    def path(self):
        return None if self._fh is None else self._fh.name

    def close(self):
        if self._fh is not None:
            self._fh.close()
            self._fh = None
            self._suffix = None
