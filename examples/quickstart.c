/* The README's client example: report one request to tokenmeterd. */
#include <stdio.h>
#include <tokenmeter/tokenmeter.h>

int main(int argc, char** argv) {
  tm_options* o = tm_options_new();
  tm_options_set_model(o, "my-model");
  if (argc > 1) tm_options_set_socket_path(o, argv[1]);
  tm_client* c;
  if (tm_client_new(o, &c) != TM_OK) return 1;
  tm_options_free(o);
  tm_arrived(c, 0, 42, /*prompt_tokens=*/128, /*max_tokens=*/256, /*n=*/1);
  tm_scheduled(c, 0, 42);
  for (int i = 0; i < 16; i++) tm_tokens(c, 0, 42, 1); /* one per step */
  tm_finished(c, 0, 42, TM_FINISH_STOP);
  uint64_t s[TM_STAT_COUNT];
  tm_client_close(c, s, TM_STAT_COUNT); /* flushes, bounded by 1 s */
  printf("sent %llu events, dropped %llu\n",
         (unsigned long long)s[TM_STAT_EVENTS_SENT],
         (unsigned long long)s[TM_STAT_EVENTS_DROPPED]);
  return 0;
}
