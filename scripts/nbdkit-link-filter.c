/* An nbdkit filter modelling a network link in front of a server, for scripts/bench-nbd.
 *
 * nbdkit's own filters cannot model one: the delay filter counts whole milliseconds in
 * nbdkit 1.32 (a datacenter round trip is 0.2 ms), and the rate filter is a token bucket,
 * which lets a request through at no cost whenever the bucket refilled while the server
 * was idle (a serial client visiting 8 servers in turn would never wait for bandwidth) and
 * starves requests larger than the bucket. A link is neither: every byte crosses it at
 * the line rate, queued behind the bytes before it, and every request pays a round trip.
 *
 *   nbdkit --filter=./nbdkit-link-filter.so memory 1G link-mbps=10000 link-rtt-us=200
 *
 * Model, per server (every connection shares its link, as a target's NIC would be):
 * - two directions (full duplex): a write's payload goes up, a read's comes down;
 * - a request's payload of S bytes occupies its direction for S * 8 / rate, starting when
 *   the direction is free (FIFO behind earlier payloads): serialisation;
 * - the request then completes one round trip later: propagation there and back;
 * - requests without payload (flush, trim, zero) cost the round trip only.
 * The request waits (clock_nanosleep to an absolute time, so scheduling delays do not
 * accumulate across queued requests) before being passed on. The local Unix socket's
 * own cost comes on top of the model; it is small next to a modelled link but not zero.
 *
 * Written for stripefs from nbdkit's filter API (nbdkit-filter(3)); build:
 *   gcc -O2 -Wall -shared -fPIC -o nbdkit-link-filter.so nbdkit-link-filter.c
 */

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-filter.h>

static uint64_t rate_mbps;   /* megabits per second; 0: no bandwidth limit */
static uint64_t rtt_ns;      /* round trip */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t busy_until[2]; /* per direction, CLOCK_MONOTONIC ns */

enum dir { UP = 0, DOWN = 1 };

static uint64_t
now_ns (void)
{
  struct timespec ts;
  clock_gettime (CLOCK_MONOTONIC, &ts);
  return (uint64_t) ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int
link_config (nbdkit_next_config *next, nbdkit_backend *nxdata,
             const char *key, const char *value)
{
  if (strcmp (key, "link-mbps") == 0)
    return nbdkit_parse_uint64_t ("link-mbps", value, &rate_mbps);
  if (strcmp (key, "link-rtt-us") == 0) {
    uint64_t us;
    if (nbdkit_parse_uint64_t ("link-rtt-us", value, &us) == -1)
      return -1;
    rtt_ns = us * 1000;
    return 0;
  }
  return next (nxdata, key, value);
}

#define link_config_help \
  "link-mbps=<MBIT/S>      Line rate of the modelled link (0: unlimited).\n" \
  "link-rtt-us=<USEC>      Round trip of the modelled link."

/* Waits until a request moving `bytes` in direction `d` would complete. */
static void
cross (enum dir d, uint64_t bytes)
{
  uint64_t done;

  pthread_mutex_lock (&lock);
  {
    uint64_t start = now_ns ();
    if (busy_until[d] > start)
      start = busy_until[d];
    /* bits * 1000 / Mbit/s = ns */
    uint64_t wire = rate_mbps ? bytes * 8 * 1000 / rate_mbps : 0;
    busy_until[d] = start + wire;
    done = busy_until[d] + rtt_ns;
  }
  pthread_mutex_unlock (&lock);

  struct timespec ts = {
    .tv_sec = done / 1000000000,
    .tv_nsec = done % 1000000000,
  };
  while (clock_nanosleep (CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
    ;
}

static int
link_pread (nbdkit_next *next, void *handle, void *buf, uint32_t count,
            uint64_t offset, uint32_t flags, int *err)
{
  cross (DOWN, count);
  return next->pread (next, buf, count, offset, flags, err);
}

static int
link_pwrite (nbdkit_next *next, void *handle, const void *buf, uint32_t count,
             uint64_t offset, uint32_t flags, int *err)
{
  cross (UP, count);
  return next->pwrite (next, buf, count, offset, flags, err);
}

static int
link_flush (nbdkit_next *next, void *handle, uint32_t flags, int *err)
{
  cross (UP, 0);
  return next->flush (next, flags, err);
}

static int
link_trim (nbdkit_next *next, void *handle, uint32_t count, uint64_t offset,
           uint32_t flags, int *err)
{
  cross (UP, 0);
  return next->trim (next, count, offset, flags, err);
}

static int
link_zero (nbdkit_next *next, void *handle, uint32_t count, uint64_t offset,
           uint32_t flags, int *err)
{
  cross (UP, 0);
  return next->zero (next, count, offset, flags, err);
}

static struct nbdkit_filter filter = {
  .name = "link",
  .longname = "stripefs bench-nbd link model",
  .config = link_config,
  .config_help = link_config_help,
  .pread = link_pread,
  .pwrite = link_pwrite,
  .flush = link_flush,
  .trim = link_trim,
  .zero = link_zero,
};

NBDKIT_REGISTER_FILTER (filter)
