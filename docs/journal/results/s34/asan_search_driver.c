#include "search.h"
#include <stdio.h>
#include <stdlib.h>
#include <math.h>
static int cmp(const void *a, const void *b){double x=*(const double*)a,y=*(const double*)b;return (x>y)-(x<y);}
int main(void){
  double fr[]={1.0,0.75,0.5,0.3,0.2,0.12,0.07,0.04,0.02,0.01,0.005,0.0};
  int64_t cb[]={2,4,8,15,31,63,255}; double off[]={0.5,0.35,0.2};
  ckz_search_spec spec={fr,12,cb,7,off,3,8.0,0.02,14,1<<16,40};
  srand(1); long ok=0;
  for(int t=0;t<3000;t++){
    size_t n = (size_t[]){0,1,2,3,5,17,100,1000,70000,140000}[t%10];
    double *v=malloc((n?n:1)*sizeof *v);
    for(size_t i=0;i<n;i++){ double u=(rand()+1.0)/(RAND_MAX+2.0), w=(rand()+1.0)/(RAND_MAX+2.0);
      double g=sqrt(-2*log(u))*cos(6.283185307*w); v[i]= (t%4==0)? 0.0 : (t%4==1)? round(g*2)/2 : (t%4==2)? g*g*g : g*1e-30; }
    qsort(v,n,sizeof *v,cmp);
    double e=0; for(size_t i=0;i<n;i++) e+=v[i]*v[i];
    ckz_choice c; double budgets[]={0,0.01,0.1,0.5,2.0};
    int r=ckz_quantize_search(v,n,e>0?e:1e-300,budgets[t%5],t%3!=0,&spec,&c);
    if(r==0) ok++; else if(r!=-2) {printf("status %d n=%zu\n", r, n);}
    free(v);
  }
  printf("ok %ld\n", ok); return 0;
}
