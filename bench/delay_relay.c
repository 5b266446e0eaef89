/* A TCP relay that holds every byte for a fixed one-way delay in each
 * direction: a network link with a round-trip time of 2 * DELAY_US between a
 * client machine and a database server, on one machine (no netem here).
 * Used by bench/log-capture to replay over a link, where a replayer that
 * keeps few statements in flight is paced by the round trip.
 *
 *   delay_relay LISTEN_PORT UPSTREAM_HOST UPSTREAM_PORT DELAY_US
 *
 * Single-threaded epoll. Per connection and direction: a 1 MiB buffer and a
 * queue of marks (the buffer's end when bytes arrived, and the time they may
 * leave); bytes are written once their mark's time has come, in order, so
 * the stream is delayed but never reordered. A full buffer stops reading
 * that side until it drains. Prints "ready" once listening. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "relay_net.h"

#define BUF (1 << 20)
#define MARKS 4096
#define MAX_CONNS 4096

struct dir {
  int from, to;
  char *buf;
  size_t head, tail; /* bytes [tail, head) wait to be written */
  struct {
    uint64_t at;
    size_t end;
  } mark[MARKS];
  unsigned mfront, mback; /* marks [mfront, mback) modulo MARKS */
};
struct conn {
  int fd[2]; /* 0 client, 1 upstream */
  struct dir d[2]; /* d[i]: from fd[i] to fd[1 - i] */
  unsigned armed[2];
  int dead;
};
struct tag {
  struct conn *c;
  int side;
};

static int ep;
static uint64_t delay_ns;
static struct conn *conns[MAX_CONNS];
static int nconns;

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Interest of side i: read while its outgoing buffer has room and marks are
 * free; write while bytes due for it are held back by a short write. */
static void arm(struct conn *c, struct tag *tags, int pending_out[2]) {
  for (int i = 0; i < 2; i++) {
    struct dir *d = &c->d[i];
    unsigned ev = 0;
    if (d->head < BUF && d->mback - d->mfront < MARKS) ev |= EPOLLIN;
    if (pending_out[i]) ev |= EPOLLOUT;
    if (ev == c->armed[i]) continue;
    c->armed[i] = ev;
    struct epoll_event e = {.events = ev, .data.ptr = &tags[i]};
    epoll_ctl(ep, EPOLL_CTL_MOD, c->fd[i], &e);
  }
}

/* Writes the bytes of d whose time has come; returns 1 if some are due but
 * the socket would block, -1 when the connection is gone. */
static int release(struct dir *d, uint64_t now) {
  while (d->mfront != d->mback && d->mark[d->mfront % MARKS].at <= now) {
    size_t end = d->mark[d->mfront % MARKS].end;
    while (d->tail < end) {
      ssize_t n = write(d->to, d->buf + d->tail, end - d->tail);
      if (n < 0 && errno == EAGAIN) return 1;
      if (n <= 0) return -1;
      d->tail += (size_t)n;
    }
    d->mfront++;
  }
  if (d->mfront == d->mback && d->tail == d->head) d->tail = d->head = 0;
  return 0;
}

static int take(struct dir *d, uint64_t now) {
  ssize_t n = read(d->from, d->buf + d->head, BUF - d->head);
  if (n < 0 && errno == EAGAIN) return 0;
  if (n <= 0) return -1;
  d->head += (size_t)n;
  d->mark[d->mback % MARKS].at = now + delay_ns;
  d->mark[d->mback % MARKS].end = d->head;
  d->mback++;
  return 0;
}

static void drop(struct conn *c) {
  close(c->fd[0]);
  close(c->fd[1]);
  free(c->d[0].buf);
  free(c->d[1].buf);
  c->dead = 1;
}

int main(int argc, char **argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: delay_relay LISTEN_PORT UPSTREAM_HOST UPSTREAM_PORT DELAY_US\n");
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  delay_ns = (uint64_t)strtoull(argv[4], NULL, 10) * 1000u;
  struct sockaddr_in up;
  if (relay_upstream(argv[2], argv[3], &up)) {
    fprintf(stderr, "delay_relay: upstream host %s is not an IPv4 address\n", argv[2]);
    return 2;
  }
  int ls = relay_listen(argv[1]);
  if (ls < 0) return 1;
  ep = epoll_create1(0);
  struct epoll_event le = {.events = EPOLLIN, .data.ptr = NULL};
  epoll_ctl(ep, EPOLL_CTL_ADD, ls, &le);
  printf("ready\n");
  fflush(stdout);
  static struct tag tags[MAX_CONNS][2];
  struct epoll_event evs[256];
  for (;;) {
    /* Sleep until the earliest held byte is due, or an event. */
    uint64_t now = now_ns(), next = UINT64_MAX;
    for (int k = 0; k < nconns; k++) {
      struct conn *c = conns[k];
      for (int i = 0; i < 2; i++)
        if (c->d[i].mfront != c->d[i].mback && !(c->armed[1 - i] & EPOLLOUT)) {
          uint64_t at = c->d[i].mark[c->d[i].mfront % MARKS].at;
          if (at < next) next = at;
        }
    }
    struct timespec ts = {0, 0}, *tp = NULL;
    if (next != UINT64_MAX) {
      uint64_t wait = next > now ? next - now : 0;
      ts.tv_sec = (time_t)(wait / 1000000000u);
      ts.tv_nsec = (long)(wait % 1000000000u);
      tp = &ts;
    }
    int n = epoll_pwait2(ep, evs, 256, tp, NULL);
    now = now_ns();
    for (int e = 0; e < n; e++) {
      if (evs[e].data.ptr == NULL) {
        int fds[2], r;
        while ((r = relay_accept_pair(ls, &up, fds)) != 0) {
          if (r < 0) continue;
          if (nconns == MAX_CONNS) {
            close(fds[0]);
            close(fds[1]);
            continue;
          }
          int cfd = fds[0], ufd = fds[1];
          struct conn *c = calloc(1, sizeof *c);
          c->fd[0] = cfd;
          c->fd[1] = ufd;
          for (int i = 0; i < 2; i++) {
            c->d[i].from = c->fd[i];
            c->d[i].to = c->fd[1 - i];
            c->d[i].buf = malloc(BUF);
          }
          int slot = nconns++;
          conns[slot] = c;
          for (int i = 0; i < 2; i++) {
            tags[slot][i].c = c;
            tags[slot][i].side = i;
            c->armed[i] = EPOLLIN;
            struct epoll_event ce = {.events = EPOLLIN, .data.ptr = &tags[slot][i]};
            epoll_ctl(ep, EPOLL_CTL_ADD, c->fd[i], &ce);
          }
        }
        continue;
      }
      struct tag *t = evs[e].data.ptr;
      if (t->c->dead) continue;
      if ((evs[e].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) && take(&t->c->d[t->side], now) < 0) drop(t->c);
    }
    /* Release what is due on every connection; drop the dead ones. */
    for (int k = 0; k < nconns;) {
      struct conn *c = conns[k];
      int blocked[2] = {0, 0}; /* blocked[i]: side i has due bytes it cannot take */
      for (int i = 0; i < 2 && !c->dead; i++) {
        int r = release(&c->d[i], now);
        if (r < 0) drop(c);
        else blocked[1 - i] = r;
      }
      if (c->dead) {
        free(c);
        conns[k] = conns[--nconns];
        tags[k][0] = tags[nconns][0];
        tags[k][1] = tags[nconns][1];
        if (k < nconns) {
          /* The moved connection's epoll tags now live in slot k. */
          for (int i = 0; i < 2; i++) {
            struct epoll_event ce = {.events = conns[k]->armed[i], .data.ptr = &tags[k][i]};
            epoll_ctl(ep, EPOLL_CTL_MOD, conns[k]->fd[i], &ce);
          }
        }
        continue;
      }
      arm(c, tags[k], blocked);
      k++;
    }
  }
}
