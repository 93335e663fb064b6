#define _GNU_SOURCE
#include <string.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdint.h>
#include <time.h>
#include <stdatomic.h>
#include <stdlib.h>
typedef void *(*save_t)(void);
typedef void (*restore_t)(void *);
static save_t real_save; static restore_t real_restore;
#define SLOTS 4096
static _Atomic uint64_t n_save, n_restore, wait_ns, n_slow;
static void *addr[SLOTS]; static _Atomic uint64_t cnt[SLOTS], waitc[SLOTS];
static __thread void *last_caller;
static int enabled = -1;
static uint64_t now(void){struct timespec t; clock_gettime(CLOCK_MONOTONIC,&t); return t.tv_sec*1000000000ull+t.tv_nsec;}
static unsigned slot(void *a){ uintptr_t h=((uintptr_t)a>>2)*11400714819323198485ull; unsigned i=h>>52; for(int k=0;k<SLOTS;k++){unsigned j=(i+k)%SLOTS; void *cur=__atomic_load_n(&addr[j],__ATOMIC_RELAXED); if(cur==a) return j; if(!cur){void *exp=NULL; if(__atomic_compare_exchange_n(&addr[j],&exp,a,0,__ATOMIC_RELAXED,__ATOMIC_RELAXED)||exp==a) return j;}} return 0;}
void *PyEval_SaveThread(void){
  if(!real_save){real_save=(save_t)dlsym(RTLD_NEXT,"PyEval_SaveThread"); real_restore=(restore_t)dlsym(RTLD_NEXT,"PyEval_RestoreThread");}
  if(enabled<0) enabled = getenv("GILCOUNT")!=NULL;
  if(enabled){ void *a=__builtin_return_address(0); last_caller=a; atomic_fetch_add(&n_save,1); atomic_fetch_add(&cnt[slot(a)],1);}
  return real_save();
}
void PyEval_RestoreThread(void *ts){
  if(!real_restore){real_save=(save_t)dlsym(RTLD_NEXT,"PyEval_SaveThread"); real_restore=(restore_t)dlsym(RTLD_NEXT,"PyEval_RestoreThread");}
  if(!enabled){real_restore(ts);return;}
  uint64_t t=now(); real_restore(ts); uint64_t d=now()-t;
  atomic_fetch_add(&n_restore,1); atomic_fetch_add(&wait_ns,d); if(d>20000) atomic_fetch_add(&n_slow,1);
  if(last_caller) atomic_fetch_add(&waitc[slot(last_caller)],d);
}
void gilcount_reset(void){n_save=n_restore=wait_ns=n_slow=0; for(int i=0;i<SLOTS;i++){cnt[i]=0;waitc[i]=0;}}
void gilcount_report(const char *tag){
  fprintf(stderr,"[gil %s] releases %lu, restores %lu, wait %.3f s, slow(>20us) %lu\n",tag,(unsigned long)n_save,(unsigned long)n_restore,wait_ns/1e9,(unsigned long)n_slow);
  /* libraries */
  const char *libs[64]; uint64_t lc[64]={0}, lw[64]={0}; int nl=0;
  for(int i=0;i<SLOTS;i++) if(addr[i]&&cnt[i]){Dl_info inf; const char *nm="?"; if(dladdr(addr[i],&inf)&&inf.dli_fname) nm=inf.dli_fname; int j; for(j=0;j<nl;j++) if(libs[j]==nm||!strcmp(libs[j],nm)) break; if(j==nl&&nl<64){libs[nl++]=nm;} if(j<64){lc[j]+=cnt[i]; lw[j]+=waitc[i];}}
  for(int j=0;j<nl;j++) fprintf(stderr,"   %8lu releases  %.3f s waited  %s\n",(unsigned long)lc[j],lw[j]/1e9,libs[j]);
}
void gilcount_top(int top){
  for(int t=0;t<top;t++){ int best=-1; uint64_t bc=0; for(int i=0;i<SLOTS;i++) if(addr[i]&&cnt[i]&&waitc[i]>=bc){bc=waitc[i];best=i;}
    if(best<0) break; Dl_info inf; const char *s="?", *f="?"; if(dladdr(addr[best],&inf)){ if(inf.dli_sname) s=inf.dli_sname; if(inf.dli_fname) f=strrchr(inf.dli_fname,'/')+1;}
    fprintf(stderr,"   %8lu rel %.3f s  %s %s off=%lx\n",(unsigned long)cnt[best],waitc[best]/1e9,f,s,(unsigned long)((char*)addr[best]-(char*)inf.dli_fbase)); cnt[best]=0; }
}
